//! What every controller binary is configured with, from flags or the
//! environment (the chart sets the environment).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::errors::Backoff;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line, for log pipelines (the default).
    Json,
    /// Human-readable lines, for a terminal.
    Text,
}

/// Flags and environment of a controller binary.
#[derive(Debug, Clone, Parser)]
#[command(version)]
pub struct Config {
    /// Namespaces to watch, comma-separated; all namespaces if empty.
    #[arg(long, env = "CAIRN_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Name of the leader-election Lease; `cairn-<controller>` if unset.
    #[arg(long, env = "CAIRN_LEASE_NAME")]
    pub lease_name: Option<String>,
    /// Namespace of the Lease; the pod's own (POD_NAMESPACE) if unset.
    #[arg(long, env = "CAIRN_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Address of the admin server (/livez, /readyz, /metrics).
    #[arg(long, env = "CAIRN_ADMIN_ADDRESS", default_value = "0.0.0.0:8080")]
    pub admin_address: SocketAddr,
    /// Address of the HTTPS conversion-webhook server (the chart sets
    /// 0.0.0.0:9443); no webhook server if unset.
    #[arg(long, env = "CAIRN_WEBHOOK_ADDRESS")]
    pub webhook_address: Option<SocketAddr>,
    /// Folder with tls.crt and tls.key for the webhook server (mounted by the
    /// chart); if unset the controller manages its own CA in a Secret.
    #[arg(long, env = "CAIRN_WEBHOOK_CERT_DIR")]
    pub webhook_cert_dir: Option<PathBuf>,
    /// DNS name the API server reaches the webhook at (the webhook Service,
    /// `<service>.<namespace>.svc`), written into self-managed certificates.
    #[arg(long, env = "CAIRN_WEBHOOK_SERVICE")]
    pub webhook_service: Option<String>,
    /// Log format.
    #[arg(long, env = "CAIRN_LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
    /// Log filter, in tracing's EnvFilter syntax (e.g. "info,kube=warn").
    #[arg(long, env = "CAIRN_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Objects reconciled at the same time, per kind.
    #[arg(long, env = "CAIRN_CONCURRENCY", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub concurrency: u16,
    /// Seconds between reconciles of an object that changed nothing (drift checks).
    #[arg(long, env = "CAIRN_RESYNC_SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(10..))]
    pub resync_seconds: u64,
    /// First retry delay after a transient error, in seconds.
    #[arg(long, env = "CAIRN_BACKOFF_INITIAL_SECONDS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub backoff_initial_seconds: u64,
    /// Longest retry delay, in seconds.
    #[arg(long, env = "CAIRN_BACKOFF_MAX_SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub backoff_max_seconds: u64,
    /// Seconds watches may keep failing before /livez fails.
    #[arg(long, env = "CAIRN_WATCH_FAILURE_LIMIT_SECONDS", default_value_t = 60)]
    pub watch_failure_limit_seconds: u64,
    /// Seconds in-flight reconciles may take to finish after SIGTERM before
    /// the lease is released anyway (keep below the pod's grace period).
    #[arg(long, env = "CAIRN_SHUTDOWN_GRACE_SECONDS", default_value_t = 20)]
    pub shutdown_grace_seconds: u64,
    /// OTLP endpoint for traces; tracing export is off if unset.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Instead of running: GET this `http://host:port/path` until it answers
    /// 200 (exit 0), for up to 30 s (then exit 1). The charts' `helm test`
    /// pod runs the controller's own image this way, so it needs no image of
    /// its own.
    #[arg(long, value_name = "URL")]
    pub probe: Option<String>,
}

impl Config {
    /// The configuration from the command line and the environment; exits
    /// with a usage message naming the bad flag if one is invalid.
    /// With `--probe URL`, probes and exits instead of returning.
    pub fn load() -> Self {
        let config = Self::parse();
        if let Some(url) = &config.probe {
            match crate::admin::probe(url, Duration::from_secs(30)) {
                Ok(()) => {
                    println!("{url}: 200 OK");
                    std::process::exit(0);
                }
                Err(e) => {
                    eprintln!("{url}: {e}");
                    std::process::exit(1);
                }
            }
        }
        config
    }

    /// The retry policy for transient errors.
    pub fn backoff(&self) -> Backoff {
        Backoff {
            initial: Duration::from_secs(self.backoff_initial_seconds),
            max: Duration::from_secs(self.backoff_max_seconds.max(self.backoff_initial_seconds)),
        }
    }

    /// The Lease's name for controller `controller`.
    pub fn lease_name(&self, controller: &str) -> String {
        self.lease_name
            .clone()
            .unwrap_or_else(|| format!("cairn-{controller}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        Config::try_parse_from(std::iter::once("controller").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_fit_a_chart_deployment() {
        let config = parse(&[]).expect("defaults are valid");
        assert!(config.namespaces.is_empty());
        assert_eq!(config.admin_address.port(), 8080);
        assert_eq!(config.log_format, LogFormat::Json);
        assert_eq!(config.lease_name("database"), "cairn-database");
        assert_eq!(config.backoff().initial, Duration::from_secs(5));
        assert_eq!(config.backoff().max, Duration::from_secs(300));
        assert_eq!(config.otlp_endpoint, None);
    }

    #[test]
    fn flags_override_defaults() {
        let config = parse(&[
            "--namespaces=a,b",
            "--log-format=text",
            "--concurrency=8",
            "--lease-name=custom",
            "--backoff-initial-seconds=1",
            "--backoff-max-seconds=30",
        ])
        .expect("valid flags");
        assert_eq!(config.namespaces, vec!["a", "b"]);
        assert_eq!(config.log_format, LogFormat::Text);
        assert_eq!(config.concurrency, 8);
        assert_eq!(config.lease_name("database"), "custom");
        assert_eq!(config.backoff().max, Duration::from_secs(30));
    }

    #[test]
    fn bad_values_are_clear_errors() {
        for bad in [
            &["--concurrency=0"][..],
            &["--log-format=yaml"],
            &["--admin-address=nowhere"],
            &["--resync-seconds=1"],
        ] {
            let error = parse(bad).expect_err("must be rejected");
            let kind = error.kind();
            assert!(
                matches!(
                    kind,
                    clap::error::ErrorKind::ValueValidation | clap::error::ErrorKind::InvalidValue
                ),
                "{bad:?}: {kind:?}: {error}"
            );
            // The message names the flag.
            let flag = bad[0].split('=').next().unwrap_or_default();
            assert!(error.to_string().contains(flag), "{error}");
        }
    }
}
