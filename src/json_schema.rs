//! The JSON Schema generator every schema of the crate goes through, so the committed
//! `schemas/*.schema.json` files and the validators built at run time agree. A leaf: the
//! ladder, the package and the choice generate their own schemas with it, and the registry
//! of all of them (`schema`) sits above them all.

use schemars::JsonSchema;

/// The JSON Schema (draft 2020-12) of a type, as a JSON value, with the keywords a reader
/// looks for first (`$schema`, `title`, `description`) at the top.
pub fn schema_for<T: JsonSchema>() -> serde_json::Value {
    let schema = schemars::generate::SchemaSettings::draft2020_12()
        .for_deserialize()
        .into_generator()
        .into_root_schema_for::<T>();
    match schema.to_value() {
        serde_json::Value::Object(mut members) => {
            let mut ordered = serde_json::Map::new();
            for key in ["$schema", "title", "description"] {
                if let Some(value) = members.shift_remove(key) {
                    ordered.insert(key.to_owned(), value);
                }
            }
            ordered.extend(members);
            serde_json::Value::Object(ordered)
        }
        other => other,
    }
}
