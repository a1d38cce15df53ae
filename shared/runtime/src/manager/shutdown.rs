//! SIGTERM and SIGINT, as one flag every part of a process can wait on.
//!
//! [`termination_signal`] must be called within a Tokio runtime: it spawns
//! the task that listens for the signals.

use tokio::sync::watch;

/// Becomes true on the first SIGTERM or SIGINT.
pub fn termination_signal() -> watch::Receiver<bool> {
    let (sender, receiver) = watch::channel(false);
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM");
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        }
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
