//! Logs and traces: `tracing` with JSON (default) or text logs, and OTLP
//! trace export when an endpoint is configured. Without an endpoint no
//! OpenTelemetry layer is installed at all, so tracing costs nothing more.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::LogFormat;

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("invalid log filter: {0}")]
    Filter(#[from] tracing_subscriber::filter::ParseError),
    #[error("OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("a global tracing subscriber is already installed: {0}")]
    AlreadyInstalled(#[from] tracing_subscriber::util::TryInitError),
}

/// Installed telemetry; call [`Telemetry::shutdown`] before exiting so the
/// last spans are exported.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Nothing installed: for tests of the manager, which must not install
    /// the process's global subscriber.
    #[cfg(test)]
    pub(crate) fn none() -> Self {
        Self { provider: None }
    }

    /// Flushes and stops the trace exporter. Blocks while it exports: call it
    /// outside async code (e.g. in `spawn_blocking`) or at the very end.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(e) = provider.shutdown()
        {
            eprintln!("trace exporter did not shut down cleanly: {e}");
        }
    }
}

/// Installs the global subscriber of a controller named `service`.
/// `otlp_endpoint` is the collector's base URL (`http://collector:4318`);
/// traces go to `<endpoint>/v1/traces` over OTLP/HTTP.
pub fn init(
    service: &str,
    format: LogFormat,
    filter: &str,
    otlp_endpoint: Option<&str>,
) -> Result<Telemetry, TelemetryError> {
    let filter = EnvFilter::try_new(filter)?;
    let logs = match format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
            .boxed(),
    };
    let provider = match otlp_endpoint {
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
                .build()?;
            Some(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(
                        Resource::builder()
                            .with_service_name(service.to_owned())
                            .build(),
                    )
                    .build(),
            )
        }
        None => None,
    };
    let traces = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer(service.to_owned())));
    tracing_subscriber::registry()
        .with(filter)
        .with(logs)
        .with(traces)
        .try_init()?;
    Ok(Telemetry { provider })
}
