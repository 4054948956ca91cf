//! Running the `prepare` binary as a user does.

use std::path::Path;

use assert_cmd::Command;

/// The `prepare` binary this build made.
pub fn prepare() -> Command {
    Command::cargo_bin("prepare").expect("the binary builds")
}

/// Runs `command` to its end; returns its exit code (`None` when a signal ended it, as the
/// command's timeout does), stdout and stderr, which must be UTF-8.
pub fn finish(command: &mut Command) -> (Option<i32>, String, String) {
    let output = command.output().expect("prepare runs");
    (
        output.status.code(),
        String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    )
}

/// Runs `prepare ARGS`, which must exit; returns its exit code, stdout and stderr.
pub fn run(args: &[&str]) -> (i32, String, String) {
    exited(prepare().args(args))
}

/// Runs `prepare ARGS` in `dir`, which must exit; returns its exit code, stdout and stderr.
pub fn run_in(dir: &Path, args: &[&str]) -> (i32, String, String) {
    exited(prepare().current_dir(dir).args(args))
}

/// [`finish`] for a command that must exit rather than be killed.
fn exited(command: &mut Command) -> (i32, String, String) {
    let (code, stdout, stderr) = finish(command);
    let code = code.unwrap_or_else(|| panic!("prepare was killed: {stderr}"));
    (code, stdout, stderr)
}

/// The arguments of `prepare export --collective-ladder LADDER --out OUT FLAGS`.
pub fn export_args<'a>(ladder: &'a str, out: &'a str, flags: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["export", "--collective-ladder", ladder, "--out", out];
    args.extend_from_slice(flags);
    args
}
