//! Tests that need a process of their own (they set the environment, load a library for the
//! rest of the process, or measure their children), and tests that start this binary again as a
//! helper.

use std::process::{Command, Output};

/// Set to the test's name in the process that [`in_own_process`] starts for it.
const ALONE: &str = "PREPARE_TEST_ALONE";

/// The name this binary lists the test `function` of the module `module_path` under: the module
/// path without the crate's name. See [`test_name!`](crate::test_name).
pub fn test_name(module_path: &str, function: &str) -> String {
    let module = module_path
        .split_once("::")
        .map_or("", |(_, module)| module);
    format!("{module}::{function}")
}

/// The full name of the test function `$function` of this module, as [`rerun`] and [`in_own_process`] take
/// it; the function must exist.
#[macro_export]
macro_rules! test_name {
    ($function:ident) => {{
        let _: fn() = $function;
        $crate::support::process::test_name(module_path!(), stringify!($function))
    }};
}

/// This test binary, started again to run the one test `name`, ignored or not, with its output
/// shown.
pub fn rerun(name: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("the test binary has a path"));
    command.args([
        name,
        "--exact",
        "--include-ignored",
        "--test-threads=1",
        "--nocapture",
    ]);
    command
}

/// What a [`rerun`] printed, stdout then stderr; panics with it unless the one test ran and
/// passed.
pub fn passed(output: &Output) -> String {
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && log.contains("test result: ok. 1 passed"),
        "the test run in a process of its own failed ({}):\n{log}",
        output.status
    );
    log
}

/// Whether this process is to run the body of test `name` (see [`test_name!`](crate::test_name)),
/// which needs a process of its own. In the test run it is not: this starts the binary again on
/// that test alone, which must pass, and returns false. In that process it returns true.
pub fn in_own_process(name: &str) -> bool {
    if std::env::var_os(ALONE).is_some_and(|running| running == name) {
        return true;
    }
    let output = rerun(name)
        .env(ALONE, name)
        .output()
        .expect("the test binary starts again");
    passed(&output);
    false
}
