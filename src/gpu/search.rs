//! Where Python environments keep NVIDIA's pip wheels, for the NVRTC and NCCL loaders: both open
//! their library by absolute path from a wheel rather than rely on the loader path, which a pip
//! install never changes. Also how both declare and bind the entry points of the library they
//! opened.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Declares a library's entry points once each: the struct `$api` of function pointers, each
/// field with its prototype and the symbol it binds, and `$api::bind(library, missing)`, which
/// binds every field from the `$library` opened or returns the error `missing(symbol, message)`
/// makes of the loader's refusal.
macro_rules! library_api {
    (
        $(#[$meta:meta])*
        $vis:vis struct $api:ident from $library:ty {
            $($field_vis:vis $field:ident: $prototype:ty = $symbol:literal,)*
        }
    ) => {
        $(#[$meta])*
        $vis struct $api {
            $($field_vis $field: $prototype,)*
        }

        impl $api {
            fn bind<E>(
                library: &$library,
                missing: impl Fn(&'static str, String) -> E,
            ) -> Result<Self, E> {
                Ok($api {
                    $($field: {
                        // SAFETY: the field this initialises has the prototype the library's
                        // header declares for the symbol (with cudarc's layouts of its types),
                        // and the pointer is used only while its owner keeps the library loaded.
                        let symbol = unsafe { library.get(concat!($symbol, "\0").as_bytes()) }
                            .map_err(|error: libloading::Error| {
                                missing($symbol, error.to_string())
                            })?;
                        *symbol
                    },)*
                })
            }
        }
    };
}
pub(super) use library_api;

/// The value of an environment variable as a path, when set and not empty.
pub(super) fn variable_path(
    variable: &dyn Fn(&str) -> Option<OsString>,
    name: &str,
) -> Option<PathBuf> {
    variable(name)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
}

/// Python environment prefixes whose `lib*/python3*/{site,dist}-packages` may hold a wheel, in
/// order: `VIRTUAL_ENV`, `CONDA_PREFIX`, the parent of each `PATH` directory with a `python3`,
/// `sys_prefix` (what `python3` reports, which sees through pyenv and other shims), `~/.local`,
/// `/usr/local`, `/usr`.
pub(super) fn python_prefixes(
    variable: &dyn Fn(&str) -> Option<OsString>,
    sys_prefix: impl FnOnce() -> Option<PathBuf>,
) -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = Vec::new();
    prefixes.extend(variable_path(variable, "VIRTUAL_ENV"));
    prefixes.extend(variable_path(variable, "CONDA_PREFIX"));
    if let Some(path) = variable("PATH") {
        for directory in std::env::split_paths(&path) {
            if directory.join("python3").is_file() {
                prefixes.extend(directory.parent().map(Path::to_path_buf));
            }
        }
    }
    prefixes.extend(sys_prefix());
    prefixes.extend(variable_path(variable, "HOME").map(|home| home.join(".local")));
    prefixes.push(PathBuf::from("/usr/local"));
    prefixes.push(PathBuf::from("/usr"));
    deduplicated(prefixes)
}

/// The usual prefixes ([`python_prefixes`]) from this process's environment.
pub(super) fn python_prefixes_from_env() -> Vec<PathBuf> {
    python_prefixes(&|name| std::env::var_os(name), python_sys_prefix)
}

/// The `sys.prefix` that `python3` on `PATH` reports, if it runs.
fn python_sys_prefix() -> Option<PathBuf> {
    let output = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.prefix)"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let prefix = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    (output.status.success() && !prefix.is_empty()).then(|| PathBuf::from(prefix))
}

/// The paths in their first order, each once.
pub(super) fn deduplicated(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut seen = Vec::new();
    for path in paths {
        if !seen.contains(&path) {
            seen.push(path);
        }
    }
    seen
}

/// Existing directories `prefix/lib*/python3*/{site,dist}-packages/<wheel directory>`, in a
/// fixed order: `lib` before `lib64`, newest Python first, `site-packages` before
/// `dist-packages`, then `wheel_directories` in their order.
pub(super) fn wheel_directories(prefix: &Path, wheel_directories: &[&str]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for lib in ["lib", "lib64"] {
        let mut pythons = entries_starting_with(&prefix.join(lib), "python3");
        pythons.sort_by(|a, b| b.cmp(a));
        for python in pythons {
            for packages in ["site-packages", "dist-packages"] {
                for wheel in wheel_directories {
                    let directory = python.join(packages).join(wheel);
                    if directory.is_dir() {
                        found.push(directory);
                    }
                }
            }
        }
    }
    found
}

/// How [`wheel_directories`] searches under `prefix`, for an error that lists the places looked.
pub(super) fn describe_wheel_directories(prefix: &Path, wheel_directories: &[&str]) -> String {
    format!(
        "{}/lib*/python3*/{{site,dist}}-packages/{{{}}}",
        prefix.display(),
        wheel_directories.join(",")
    )
}

/// Entries of `directory` whose name starts with `prefix`, sorted; none if it cannot be read.
pub(super) fn entries_starting_with(directory: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(directory) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(prefix))
        .map(|entry| entry.path())
        .collect();
    paths.sort();
    paths
}

/// The first of `names` that is a file in `directory`.
pub(super) fn first_file_in(directory: &Path, names: &[&str]) -> Option<PathBuf> {
    names
        .iter()
        .map(|name| directory.join(name))
        .find(|path| path.is_file())
}

/// A temporary directory with an empty file at each of `files` (relative paths; their
/// directories are created), for the tests of the loaders' searches: the directory and the
/// files' paths.
#[cfg(test)]
pub(super) fn directory_with<const N: usize>(
    files: [&str; N],
) -> (tempfile::TempDir, [PathBuf; N]) {
    let root = tempfile::tempdir().unwrap();
    let paths = files.map(|file| {
        let path = root.path().join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"").unwrap();
        path
    });
    (root, paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_in_order_without_repeats() {
        let (root, [python]) = directory_with(["env/bin/python3"]);
        let bin = python.parent().unwrap();
        let path = std::env::join_paths([&root.path().join("empty"), bin]).unwrap();
        let variables = [
            ("VIRTUAL_ENV", OsString::from(root.path().join("env"))),
            ("CONDA_PREFIX", OsString::new()),
            ("PATH", path),
            ("HOME", OsString::from("/home/someone")),
        ];
        let variable = |name: &str| {
            variables
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.clone())
        };
        let prefixes = python_prefixes(&variable, || Some(PathBuf::from("/opt/python")));
        assert_eq!(
            prefixes,
            [
                root.path().join("env"),
                PathBuf::from("/opt/python"),
                PathBuf::from("/home/someone/.local"),
                PathBuf::from("/usr/local"),
                PathBuf::from("/usr"),
            ]
        );
    }

    #[test]
    fn wheel_directories_newest_python_first_site_before_dist() {
        let root = tempfile::tempdir().unwrap();
        for directory in [
            "lib/python3.10/site-packages/nvidia/a",
            "lib/python3.12/dist-packages/nvidia/a",
            "lib/python3.12/site-packages/nvidia/b",
            "lib/python3.12/site-packages/nvidia/a",
            "lib64/python3.11/site-packages/nvidia/a",
        ] {
            std::fs::create_dir_all(root.path().join(directory)).unwrap();
        }
        let found = wheel_directories(root.path(), &["nvidia/a", "nvidia/b"]);
        let relative: Vec<_> = found
            .iter()
            .map(|path| path.strip_prefix(root.path()).unwrap().to_path_buf())
            .collect();
        assert_eq!(
            relative,
            [
                PathBuf::from("lib/python3.12/site-packages/nvidia/a"),
                PathBuf::from("lib/python3.12/site-packages/nvidia/b"),
                PathBuf::from("lib/python3.12/dist-packages/nvidia/a"),
                PathBuf::from("lib/python3.10/site-packages/nvidia/a"),
                PathBuf::from("lib64/python3.11/site-packages/nvidia/a"),
            ]
        );
    }
}
