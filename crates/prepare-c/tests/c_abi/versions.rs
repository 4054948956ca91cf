//! The Python package and the C library it loads carry one version: the tool's.

use crate::repository_file;

fn read(relative: &str) -> String {
    let path = repository_file(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

#[test]
fn the_python_package_the_c_library_and_the_tool_share_a_version() {
    let version = env!("CARGO_PKG_VERSION");
    let expected = format!("version = \"{version}\"");
    assert!(
        read("Cargo.toml").lines().any(|line| line == expected),
        "Cargo.toml (the tool) is not at {version}"
    );
    assert!(
        read("python/pyproject.toml")
            .lines()
            .any(|line| line == expected),
        "python/pyproject.toml is not at {version}"
    );
    let python = format!("__version__ = \"{version}\"");
    assert!(
        read("python/prepare/__init__.py")
            .lines()
            .any(|line| line == python),
        "python/prepare/__init__.py is not at {version}"
    );
}
