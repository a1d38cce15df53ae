//! SIGTERM and SIGINT: [`signals`] for a process that must handle them from
//! its first moment (cairn-instance, PID 1 of its pod, where a signal without
//! a handler is ignored), [`termination_signal`] as one flag every part of a
//! controller can wait on.

use std::future::Future;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// Installs the SIGTERM and SIGINT handlers now (within a Tokio runtime);
/// the future completes on the first of them.
pub fn signals() -> std::io::Result<impl Future<Output = ()> + Send> {
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = interrupt.recv() => tracing::info!("SIGINT: shutting down"),
        }
    })
}

/// Becomes true on the first SIGTERM or SIGINT. Must be called within a
/// Tokio runtime: it spawns the task that waits for the signals.
pub fn termination_signal() -> watch::Receiver<bool> {
    let (sender, receiver) = watch::channel(false);
    let signalled = match signals() {
        Ok(signalled) => signalled,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM and SIGINT");
            return receiver;
        }
    };
    tokio::spawn(async move {
        signalled.await;
        let _ = sender.send(true);
        // Keep the channel open so receivers see `true`, not a closed channel.
        std::future::pending::<()>().await;
    });
    receiver
}

/// Completes once termination was requested.
pub async fn terminated(mut signal: watch::Receiver<bool>) {
    let _ = signal.wait_for(|terminated| *terminated).await;
}
