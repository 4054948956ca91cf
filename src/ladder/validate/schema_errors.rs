//! The JSON Schema stage: the ladder schema compiled once, and its errors turned into
//! diagnostics that say what would be valid (the allowed fields, names or types) rather than
//! which schema keyword failed.

use std::sync::OnceLock;

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::{ValidationError, Validator};
use serde_json::Value;

use super::diagnostic::{closest, json_string, render_value, Diagnostic, Rule};
use super::source_map::push_token;

/// The generated schema and its compiled validator.
struct Compiled {
    schema: Value,
    validator: Validator,
}

fn compiled() -> &'static Compiled {
    static COMPILED: OnceLock<Compiled> = OnceLock::new();
    COMPILED.get_or_init(|| {
        let schema = crate::json_schema::schema_for::<crate::ladder::Ladder>();
        let validator = jsonschema::draft202012::new(&schema)
            .expect("the schema generated from the ladder types is a valid draft 2020-12 schema");
        Compiled { schema, validator }
    })
}

/// Every schema violation in the value, as diagnostics.
pub(super) fn schema_diagnostics(value: &Value) -> Vec<Diagnostic> {
    let compiled = compiled();
    compiled
        .validator
        .iter_errors(value)
        .flat_map(|error| convert(&error, &compiled.schema, value))
        .collect()
}

fn convert(error: &ValidationError<'_>, schema: &Value, document: &Value) -> Vec<Diagnostic> {
    let path = error.instance_path().as_str().to_owned();
    let instance = document.pointer(&path).unwrap_or(&Value::Null);
    match error.kind() {
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            let fields = allowed_fields(schema, error.schema_path().as_str());
            unexpected
                .iter()
                .map(|field| {
                    let mut field_path = path.clone();
                    push_token(&mut field_path, field);
                    let listed = fields
                        .iter()
                        .map(String::as_str)
                        .collect::<Vec<_>>()
                        .join(", ");
                    let expected = match closest(field, fields.iter().map(String::as_str)) {
                        Some(near) => format!(
                            "a field of this object; did you mean {}? (fields: {listed})",
                            json_string(near)
                        ),
                        None => format!("a field of this object (fields: {listed})"),
                    };
                    Diagnostic::new(
                        Rule::UnknownField,
                        field_path,
                        format!("the field {}", json_string(field)),
                        expected,
                    )
                })
                .collect()
        }
        ValidationErrorKind::Required { property } => {
            let name = property.as_str().unwrap_or_default();
            let mut field_path = path;
            push_token(&mut field_path, name);
            vec![Diagnostic::new(
                Rule::MissingField,
                field_path,
                "nothing",
                format!("the required field {}", json_string(name)),
            )]
        }
        ValidationErrorKind::Type { kind } => {
            let types: Vec<&str> = match kind {
                TypeKind::Single(single) => vec![type_phrase(&single.to_string())],
                TypeKind::Multiple(set) => set
                    .iter()
                    .map(|single| type_phrase(&single.to_string()))
                    .collect(),
            };
            vec![Diagnostic::new(
                Rule::WrongType,
                path,
                found_with_type(instance),
                join_alternatives(&without_null(types)),
            )]
        }
        ValidationErrorKind::Minimum { limit } if limit.as_u64() == Some(0) => {
            vec![Diagnostic::new(
                Rule::NumberOutOfRange,
                path,
                render_value(instance),
                "a whole number, 0 or more",
            )]
        }
        ValidationErrorKind::AnyOf { .. }
        | ValidationErrorKind::OneOfNotValid { .. }
        | ValidationErrorKind::Enum { .. }
        | ValidationErrorKind::Constant { .. } => {
            let mut alternatives = Alternatives::default();
            if alternatives.collect(error, &path) {
                vec![alternatives.diagnostic(path, instance)]
            } else {
                vec![violation(error, path, instance)]
            }
        }
        _ => vec![violation(error, path, instance)],
    }
}

/// What the schema's own message says, for violations the ladder schema is not expected to
/// produce.
fn violation(error: &ValidationError<'_>, path: String, instance: &Value) -> Diagnostic {
    Diagnostic::new(
        Rule::SchemaViolation,
        path,
        render_value(instance),
        format!("a value that satisfies the schema ({error})"),
    )
}

/// The property names of the object schema whose `additionalProperties` failed.
fn allowed_fields(schema: &Value, keyword_path: &str) -> Vec<String> {
    let object_path = keyword_path
        .strip_suffix("/additionalProperties")
        .unwrap_or(keyword_path);
    schema
        .pointer(object_path)
        .and_then(|object| object.get("properties"))
        .and_then(Value::as_object)
        .map(|properties| properties.keys().cloned().collect())
        .unwrap_or_default()
}

/// The allowed names and types of a value that matched none of an enum's alternatives.
#[derive(Default)]
struct Alternatives {
    constants: Vec<Value>,
    types: Vec<&'static str>,
}

impl Alternatives {
    /// Gathers alternatives from nested `anyOf`/`oneOf`; false when a branch failed deeper
    /// inside the value, which a list of alternatives would not explain.
    fn collect(&mut self, error: &ValidationError<'_>, path: &str) -> bool {
        if error.instance_path().as_str() != path {
            return false;
        }
        match error.kind() {
            ValidationErrorKind::AnyOf { context }
            | ValidationErrorKind::OneOfNotValid { context } => context
                .iter()
                .flatten()
                .all(|nested| self.collect(nested, path)),
            ValidationErrorKind::Constant { expected_value } => {
                self.constants.push(expected_value.as_ref().clone());
                true
            }
            ValidationErrorKind::Enum { options } => {
                if let Value::Array(options) = options.as_ref() {
                    self.constants.extend(options.iter().cloned());
                }
                true
            }
            ValidationErrorKind::Type { kind } => {
                match kind {
                    TypeKind::Single(single) => self.types.push(type_phrase(&single.to_string())),
                    TypeKind::Multiple(set) => self
                        .types
                        .extend(set.iter().map(|single| type_phrase(&single.to_string()))),
                }
                true
            }
            _ => false,
        }
    }

    fn diagnostic(self, path: String, instance: &Value) -> Diagnostic {
        if self.constants.is_empty() {
            return Diagnostic::new(
                Rule::WrongType,
                path,
                found_with_type(instance),
                join_alternatives(&without_null(self.types)),
            );
        }
        // Types are left unnamed here: the names imply theirs, and a null branch only stands for
        // an absent optional field.
        let names: Vec<String> = self.constants.iter().map(render_value).collect();
        let mut expected = format!("one of {}", names.join(", "));
        let name_strings: Vec<&str> = self.constants.iter().filter_map(Value::as_str).collect();
        if let Some(text) = instance.as_str() {
            if let Some(near) = closest(text, name_strings) {
                expected = format!("{expected} (did you mean {}?)", json_string(near));
            }
        }
        let same_type = self
            .constants
            .iter()
            .any(|constant| json_type(constant) == json_type(instance));
        if same_type {
            Diagnostic::new(Rule::UnknownValue, path, render_value(instance), expected)
        } else {
            Diagnostic::new(Rule::WrongType, path, found_with_type(instance), expected)
        }
    }
}

fn type_phrase(name: &str) -> &'static str {
    match name {
        "array" => "an array",
        "boolean" => "a boolean",
        "integer" => "a whole number",
        "null" => "null",
        "number" => "a number",
        "object" => "an object",
        "string" => "a string",
        _ => "another type",
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(number) if number.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn found_with_type(value: &Value) -> String {
    format!(
        "{} ({})",
        render_value(value),
        type_phrase(json_type(value))
    )
}

/// Null stands for an absent optional field; it is named only when nothing else fits.
fn without_null(mut types: Vec<&'static str>) -> Vec<&'static str> {
    types.sort_unstable();
    types.dedup();
    if types.len() > 1 {
        types.retain(|phrase| *phrase != "null");
    }
    types
}

fn join_alternatives(phrases: &[&str]) -> String {
    match phrases {
        [] => "another type".to_owned(),
        [only] => (*only).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// Numbers the schema accepts as integers that their Rust type cannot hold: written with a
/// fraction or exponent (`2.0`, `1e3`), or too large. Found by walking the value beside the
/// schema's `format` annotations, so every one is reported, not only serde's first.
pub(super) fn unrepresentable_numbers(value: &Value) -> Vec<Diagnostic> {
    let schema = &compiled().schema;
    let mut diagnostics = Vec::new();
    let mut path = String::new();
    walk_numbers(schema, schema, value, &mut path, &mut diagnostics);
    diagnostics
}

fn walk_numbers(
    root: &Value,
    node: &Value,
    value: &Value,
    path: &mut String,
    diagnostics: &mut Vec<Diagnostic>,
) {
    if let Some(target) = node.get("$ref").and_then(Value::as_str) {
        if let Some(resolved) = target
            .strip_prefix('#')
            .and_then(|pointer| root.pointer(pointer))
        {
            walk_numbers(root, resolved, value, path, diagnostics);
        }
    }
    for keyword in ["anyOf", "oneOf", "allOf"] {
        for branch in node
            .get(keyword)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            walk_numbers(root, branch, value, path, diagnostics);
        }
    }
    match value {
        Value::Number(number) => {
            let Some(format) = node.get("format").and_then(Value::as_str) else {
                return;
            };
            let Some((low, high)) = integer_range(format) else {
                return;
            };
            let fits = number
                .as_i64()
                .map(i128::from)
                .or_else(|| number.as_u64().map(i128::from))
                .is_some_and(|whole| (low..=high).contains(&whole));
            if !fits {
                diagnostics.push(Diagnostic::new(
                    Rule::UnrepresentableValue,
                    path.clone(),
                    render_value(value),
                    format!(
                        "a whole number from {low} to {high}, written without a fraction or exponent"
                    ),
                ));
            }
        }
        Value::Object(members) => {
            let Some(properties) = node.get("properties").and_then(Value::as_object) else {
                return;
            };
            for (key, member) in members {
                if let Some(property) = properties.get(key) {
                    let length = path.len();
                    push_token(path, key);
                    walk_numbers(root, property, member, path, diagnostics);
                    path.truncate(length);
                }
            }
        }
        Value::Array(elements) => {
            let Some(items) = node.get("items") else {
                return;
            };
            for (index, element) in elements.iter().enumerate() {
                let length = path.len();
                push_token(path, &index.to_string());
                walk_numbers(root, items, element, path, diagnostics);
                path.truncate(length);
            }
        }
        _ => {}
    }
}

/// The values an integer `format` of schemars can hold.
fn integer_range(format: &str) -> Option<(i128, i128)> {
    Some(match format {
        "uint8" => (0, u8::MAX.into()),
        "uint16" => (0, u16::MAX.into()),
        "uint32" => (0, u32::MAX.into()),
        "uint64" | "uint" => (0, u64::MAX.into()),
        "int8" => (i8::MIN.into(), i8::MAX.into()),
        "int16" => (i16::MIN.into(), i16::MAX.into()),
        "int32" => (i32::MIN.into(), i32::MAX.into()),
        "int64" | "int" => (i64::MIN.into(), i64::MAX.into()),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn diagnostics(schema: &Value, document: &Value) -> Vec<Diagnostic> {
        let validator = jsonschema::draft202012::new(schema).expect("a valid schema");
        validator
            .iter_errors(document)
            .flat_map(|error| convert(&error, schema, document))
            .collect()
    }

    #[test]
    fn keywords_the_ladder_schema_does_not_use_fall_back_to_the_schema_message() {
        let schema = json!({"type": "object", "properties": {"n": {"maximum": 3}}});
        let found = diagnostics(&schema, &json!({"n": 5}));
        assert_eq!(
            found,
            vec![Diagnostic::new(
                Rule::SchemaViolation,
                "/n",
                "5",
                "a value that satisfies the schema (5 is greater than the maximum of 3)"
            )]
        );
    }

    #[test]
    fn alternatives_name_every_allowed_value_and_suggest_the_closest() {
        let schema = json!({"anyOf": [{"enum": ["pull", "push"]}, {"type": "null"}]});
        let found = diagnostics(&schema, &json!("pul"));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].rule, Rule::UnknownValue);
        assert_eq!(
            found[0].expected,
            r#"one of "pull", "push" (did you mean "pull"?)"#
        );
        let found = diagnostics(&schema, &json!(7));
        assert_eq!(found[0].rule, Rule::WrongType);
        assert_eq!(found[0].found, "7 (a whole number)");
    }
}
