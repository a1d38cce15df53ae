//! The plugin binary as kubectl runs it, without a cluster: its help names
//! every subcommand, and a bad argument is refused with a usage error (exit
//! 2), not a panic. (Against a cluster: e2e/tests/kubectl_plugin.rs, which
//! runs this same executable.)

use std::process::Command;

fn plugin(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-cairn"))
        .args(args)
        .output()
        .expect("kubectl-cairn runs")
}

#[test]
fn help_names_every_subcommand() {
    let output = plugin(&["--help"]);
    assert!(output.status.success(), "{output:?}");
    let help = String::from_utf8_lossy(&output.stdout);
    for subcommand in [
        "status",
        "backup",
        "switchover",
        "restart",
        "pause",
        "resume",
        "report",
    ] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(subcommand)),
            "{subcommand} missing from:\n{help}"
        );
    }
}

#[test]
fn an_unknown_subcommand_is_a_usage_error() {
    let output = plugin(&["frobnicate"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("frobnicate"), "{error}");
}
