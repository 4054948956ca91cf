//! The committed JSON Schemas are what the types generate, are valid draft 2020-12 schemas, and
//! judge the shipped ladders and fixtures as `prepare validate` does at the schema stage; the
//! declared minimum Rust is one the locked dependencies accept, and the one the README states.

use prepare::ladder::{validate_ladder_file, LadderError, Stage};
use prepare::schema::SchemaName;

use crate::support::repository::{self, json_files, read_json, root, valid_ladders};

fn committed_ladder_schema() -> serde_json::Value {
    let text = std::fs::read_to_string(root().join(SchemaName::Ladder.committed_path()))
        .expect("schemas/ladder.schema.json is committed");
    serde_json::from_str(&text).expect("the committed schema is JSON")
}

/// Set `PREPARE_BLESS=1` to write the generated schemas instead of comparing.
#[test]
fn committed_schemas_match_the_types() {
    let bless = std::env::var("PREPARE_BLESS").is_ok_and(|value| value == "1");
    for &name in SchemaName::ALL {
        let path = root().join(name.committed_path());
        let generated = name.generate_text();
        if bless {
            std::fs::write(&path, &generated).expect("can write the schema");
            continue;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "{} is stale or missing: the types changed. Regenerate it with\n  \
             cargo run -- schema {} > {}\nor\n  PREPARE_BLESS=1 cargo test --test integration cpu::schemas",
            name.committed_path(),
            name.name(),
            name.committed_path(),
        );
    }
}

#[test]
fn committed_schemas_are_valid_draft_2020_12() {
    for &name in SchemaName::ALL {
        let schema = name.generate();
        if let Err(error) = jsonschema::meta::validate(&schema) {
            panic!(
                "the {} schema is not a valid JSON Schema: {error}",
                name.name()
            );
        }
    }
}

#[test]
fn the_committed_schema_accepts_every_valid_ladder() {
    let validator = jsonschema::draft202012::new(&committed_ladder_schema()).expect("compiles");
    for file in valid_ladders() {
        let value = read_json(&file);
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|error| error.to_string())
            .collect();
        assert!(errors.is_empty(), "{}: {errors:?}", file.display());
    }
}

/// An editor with the committed schema flags exactly the fixtures `prepare validate` refuses
/// at the schema stage, and none that get past it.
#[test]
fn the_committed_schema_refuses_what_the_schema_stage_refuses() {
    let validator = jsonschema::draft202012::new(&committed_ladder_schema()).expect("compiles");
    for file in json_files("tests/fixtures/ladders/invalid") {
        let stage = match validate_ladder_file(&file) {
            Err(LadderError::Invalid { report, .. }) => report.stage,
            other => panic!("{}: expected a refusal, got {other:?}", file.display()),
        };
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        if stage == Stage::FormatVersion {
            continue;
        }
        assert_eq!(
            validator.is_valid(&value),
            stage != Stage::Schema,
            "{}: failed at the {stage} stage",
            file.display()
        );
    }
}

/// The files of src/ import one way: no file names an item of a file that, through others,
/// names an item of it; and so do the top-level modules (`ladder`, `package`, `gpu`, ...).
/// `PREPARE_PRINT_IMPORTS=1` prints both graphs (with `--nocapture`).
#[test]
fn source_files_import_one_way() {
    let files = repository::imports::graph(&root().join("src"));
    let modules = repository::imports::modules(&files);
    if std::env::var("PREPARE_PRINT_IMPORTS").is_ok_and(|value| value == "1") {
        #[allow(clippy::print_stdout)]
        {
            print!("{}", repository::imports::render(&files));
            print!("{}", repository::imports::render(&modules));
        }
    }
    for (what, graph) in [("files", &files), ("top-level modules", &modules)] {
        let cycles: Vec<String> = repository::imports::cycles(graph)
            .iter()
            .map(|cycle| {
                format!(
                    "{}:\n{}",
                    cycle.join(", "),
                    repository::imports::cycle_edges(graph, cycle)
                )
            })
            .collect();
        assert!(
            cycles.is_empty(),
            "{what} of src/ that name each other's items, directly or through others:\n{}",
            cycles.join("\n")
        );
    }
}

/// No source file is longer than 800 lines: Rust, CUDA, C, C++ and Python, in every folder of
/// the repository that holds them (build output, environments and ignored folders aside).
#[test]
fn no_source_file_is_longer_than_800_lines() {
    const MOST_LINES: usize = 800;
    let mut long = Vec::new();
    let mut folders = vec![root().to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder)
            .unwrap_or_else(|error| panic!("cannot list {}: {error}", folder.display()))
        {
            let path = entry.expect("a directory entry").path();
            let name = path
                .file_name()
                .and_then(|name| name.to_str())
                .unwrap_or("");
            if path.is_dir() {
                if !name.starts_with('.')
                    && !["target", "build", "dist", "gpu-carry", "__pycache__"].contains(&name)
                {
                    folders.push(path);
                }
                continue;
            }
            let source = ["rs", "cu", "cuh", "c", "cc", "h", "py"];
            if !path
                .extension()
                .and_then(|extension| extension.to_str())
                .is_some_and(|extension| source.contains(&extension))
            {
                continue;
            }
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
            let lines = text.lines().count();
            if lines > MOST_LINES {
                long.push(format!(
                    "{} ({lines} lines)",
                    path.strip_prefix(root()).unwrap_or(&path).display()
                ));
            }
        }
    }
    long.sort();
    assert!(
        long.is_empty(),
        "source files over {MOST_LINES} lines: {}",
        long.join(", ")
    );
}

/// The graph follows a path through a re-export to the file that defines the item, and finds
/// the cycle that makes; without the cycle, none.
#[test]
fn the_import_graph_follows_reexports_to_a_cycle() {
    let scratch = tempfile::tempdir().expect("a temporary directory");
    let src = scratch.path();
    let write = |name: &str, text: &str| std::fs::write(src.join(name), text).expect("writable");
    write("main.rs", "fn main() {}\n");
    write("lib.rs", "mod a;\nmod b;\npub use b::B;\n");
    write(
        "a.rs",
        "/// Not [`crate::b`].\npub struct A(pub crate::B);\n",
    );
    write("b.rs", "pub struct B;\n");
    let graph = repository::imports::graph(src);
    assert_eq!(
        repository::imports::render(&graph),
        "a.rs -> b.rs\n",
        "the re-export in lib.rs is not an edge of its own"
    );
    assert!(repository::imports::cycles(&graph).is_empty());

    write("b.rs", "pub struct B(Option<Box<super::a::A>>);\n");
    let graph = repository::imports::graph(src);
    assert_eq!(
        repository::imports::cycles(&graph),
        [["a.rs".to_owned(), "b.rs".to_owned()]]
    );
}

/// A `rust-version` as numbers: `1.88` is `[1, 88, 0]`.
fn rust_version(text: &str) -> [u32; 3] {
    let mut parts = [0; 3];
    for (part, number) in parts.iter_mut().zip(text.split('.')) {
        *part = number
            .parse()
            .unwrap_or_else(|_| panic!("{text:?} is not a Rust version"));
    }
    parts
}

/// `rust-version` in Cargo.toml is true without an older toolchain at hand: no locked
/// dependency declares a newer one, and the README says the same.
#[test]
fn the_declared_rust_version_builds_the_locked_dependencies() {
    let output = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--locked", "--format-version", "1"])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let packages = metadata["packages"].as_array().expect("a package list");
    let members = metadata["workspace_members"]
        .as_array()
        .expect("workspace members");
    let declared_of =
        |package: &serde_json::Value| package["rust_version"].as_str().map(ToOwned::to_owned);

    let mut declared: Vec<String> = packages
        .iter()
        .filter(|package| members.contains(&package["id"]))
        .map(|package| {
            declared_of(package)
                .unwrap_or_else(|| panic!("{} declares no rust-version", package["name"]))
        })
        .collect();
    declared.dedup();
    assert_eq!(declared.len(), 1, "the workspace declares {declared:?}");
    let declared = declared.remove(0);

    let newer: Vec<String> = packages
        .iter()
        .filter_map(|package| {
            let needs = declared_of(package)?;
            let name = package["name"].as_str().unwrap_or_default();
            let version = package["version"].as_str().unwrap_or_default();
            (rust_version(&needs) > rust_version(&declared))
                .then(|| format!("{name} {version} needs {needs}"))
        })
        .collect();
    assert!(
        newer.is_empty(),
        "Cargo.toml declares rust-version {declared}, but {newer:?}"
    );

    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    assert!(
        readme.contains(&format!("Rust {declared} or newer")),
        "README.md does not say \"Rust {declared} or newer\""
    );
}
