//! The registry of the JSON Schemas generated from the Rust types, so the committed
//! `schemas/*.schema.json` files and the types that read those documents cannot disagree. It
//! names every document type (ladder, manifest, show document, choice), so it sits above all
//! of them; the generator itself is [`crate::json_schema`].

use crate::json_schema::schema_for;

/// Renders a schema the way it is committed: pretty JSON with a trailing newline.
pub fn to_pretty_json(schema: &serde_json::Value) -> String {
    let mut text =
        serde_json::to_string_pretty(schema).expect("a JSON value always serializes to text");
    text.push('\n');
    text
}

/// Defines [`SchemaName`]: one line per schema, its CLI name and the type it describes.
macro_rules! schema_names {
    ($($(#[doc = $doc:literal])* $variant:ident => $name:literal, $type:ty;)+) => {
        /// The schemas `prepare schema` prints and `schemas/` commits.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
        pub enum SchemaName {
            $($(#[doc = $doc])* #[value(name = $name)] $variant,)+
        }

        impl SchemaName {
            /// Every schema, in the order they are listed.
            pub const ALL: &'static [SchemaName] = &[$(SchemaName::$variant,)+];

            /// The name on the command line and in the file name.
            pub fn name(self) -> &'static str {
                match self {
                    $(SchemaName::$variant => $name,)+
                }
            }

            /// The schema, generated from its type.
            pub fn generate(self) -> serde_json::Value {
                match self {
                    $(SchemaName::$variant => schema_for::<$type>(),)+
                }
            }
        }
    };
}

schema_names! {
    /// Collective ladders (`ladders/*.json`).
    Ladder => "ladder", crate::ladder::Ladder;
    /// Package manifests (`manifest.json`).
    Manifest => "manifest", crate::package::Manifest;
    /// The document `prepare show --json` prints.
    Show => "show", crate::show::Description;
    /// Choice files (`choice.rank<r>.json`) that startup selection writes.
    Choice => "choice", crate::tune::choice::Choice;
}

impl SchemaName {
    /// The committed file, relative to the repository root (`schemas/ladder.schema.json`).
    pub fn committed_path(self) -> String {
        format!("schemas/{}.schema.json", self.name())
    }

    /// The schema as committed: pretty JSON with a trailing newline.
    pub fn generate_text(self) -> String {
        to_pretty_json(&self.generate())
    }
}
