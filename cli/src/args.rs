//! The command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "kubectl-cairn",
    bin_name = "kubectl cairn",
    version,
    about = "Operate Cairn's PostgreSQL clusters (DatabaseClusters)",
    long_about = "Operate Cairn's PostgreSQL clusters (DatabaseClusters). Installed on PATH as \
                  kubectl-cairn, it runs as `kubectl cairn COMMAND`."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// The connection flags kubectl plugins honour.
#[derive(Args, Debug, Clone, Default)]
pub struct Global {
    /// Namespace of the cluster; the kubeconfig context's namespace when unset.
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Path to the kubeconfig file; $KUBECONFIG or ~/.kube/config when unset.
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The kubeconfig cluster to use (not a DatabaseCluster).
    #[arg(long = "cluster", global = true, value_name = "KUBECONFIG_CLUSTER")]
    pub kube_cluster: Option<String>,
    /// The kubeconfig user to use.
    #[arg(long, global = true)]
    pub user: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// One DatabaseCluster at a glance: phase, conditions, instances,
    /// primary, switchovers, archiving, backups.
    Status {
        /// The DatabaseCluster.
        cluster: String,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Create a Backup of the cluster now.
    Backup(BackupArgs),
    /// Make another instance the primary (a planned switchover).
    Switchover(SwitchoverArgs),
    /// Promote a replica while the failover is blocked, accepting the loss
    /// of acknowledged writes it lacks.
    Promote(PromoteArgs),
    /// Restart every instance, replicas first, the primary last after a switchover.
    Restart(RestartArgs),
    /// Stop the controller from changing the cluster's child objects (spec.paused).
    Pause {
        /// The DatabaseCluster.
        cluster: String,
    },
    /// Let the controller manage the cluster again (clears spec.paused).
    Resume {
        /// The DatabaseCluster.
        cluster: String,
    },
    /// Write a support bundle: the cluster, its child objects, Backups,
    /// events and logs, with Secret values left out.
    Report(ReportArgs),
    /// Print a shell completion script.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the plugin's version.
    Version,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
    Yaml,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// A physical base backup (pg_basebackup); the Backup's method `physical`.
    #[value(alias = "physical")]
    Base,
    /// A dump of the application database (pg_dump).
    Logical,
}

#[derive(Args, Debug)]
pub struct BackupArgs {
    /// The DatabaseCluster.
    pub cluster: String,
    /// Name of the Backup; `<cluster>-<UTC time>` when unset.
    #[arg(long)]
    pub name: Option<String>,
    #[arg(long, value_enum, default_value_t = Method::Base)]
    pub method: Method,
    /// Wait until the Backup is Completed or Failed (exit code 1 if Failed).
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits, e.g. 30m, 90s.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Args, Debug)]
pub struct SwitchoverArgs {
    /// The DatabaseCluster.
    pub cluster: String,
    /// The pod to promote; the healthiest ready replica when unset.
    #[arg(long, value_name = "POD")]
    pub to: Option<String>,
    /// Wait until the status shows the new primary serving.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Args, Debug)]
pub struct PromoteArgs {
    /// The DatabaseCluster.
    pub cluster: String,
    /// The replica's pod.
    pub pod: String,
    /// Accept that writes the lost primary acknowledged may be lost.
    #[arg(long)]
    pub accept_data_loss: bool,
}

#[derive(Args, Debug)]
pub struct RestartArgs {
    /// The DatabaseCluster.
    pub cluster: String,
    /// Wait until every instance restarted and the cluster is Ready.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// The DatabaseCluster.
    pub cluster: String,
    /// Write a .tar.gz file; `cairn-report-<cluster>-<UTC time>.tar.gz` when
    /// neither this nor --dir is given.
    #[arg(short = 'f', long, value_name = "FILE.tar.gz", conflicts_with = "dir")]
    pub file: Option<PathBuf>,
    /// Write the bundle into this folder instead (created; must be empty if it exists).
    #[arg(short = 'd', long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Keep at most this many bytes of each container's log (the end).
    #[arg(long, default_value_t = 10 * 1024 * 1024)]
    pub log_limit_bytes: i64,
}

/// `90s`, `5m`, `1h`, or plain seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a duration such as 90s, 5m or 1h"))?;
    let seconds = match unit {
        "s" => number,
        "m" => number * 60,
        "h" => number * 3600,
        _ => return Err(format!("{text:?}: the unit must be s, m or h")),
    };
    Ok(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("12"), Ok(Duration::from_secs(12)));
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("m").is_err());
    }

    #[test]
    fn the_command_line_is_consistent_and_takes_kubectls_flags() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "kubectl-cairn",
            "switchover",
            "web",
            "-n",
            "shop",
            "--context",
            "prod",
            "--to",
            "web-2",
        ])
        .expect("parses");
        assert_eq!(cli.global.namespace.as_deref(), Some("shop"));
        assert_eq!(cli.global.context.as_deref(), Some("prod"));
        assert!(
            matches!(cli.command, Command::Switchover(SwitchoverArgs { ref to, .. }) if to.as_deref() == Some("web-2"))
        );
        let cli = Cli::try_parse_from(["kubectl-cairn", "backup", "web", "--method", "physical"])
            .expect("physical is base");
        assert!(matches!(
            cli.command,
            Command::Backup(BackupArgs {
                method: Method::Base,
                ..
            })
        ));
        assert!(
            Cli::try_parse_from([
                "kubectl-cairn",
                "report",
                "web",
                "-f",
                "a.tar.gz",
                "-d",
                "x"
            ])
            .is_err()
        );
    }

    use clap::CommandFactory;
}
