//! Wiring SIGINT and SIGTERM to a `CancellationToken`.

use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGINT or SIGTERM; a second signal exits at once.
pub fn on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(error) => {
                tracing::error!(%error, "cannot install the SIGTERM handler");
                return;
            }
        };
        for round in 0..2 {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            if round == 0 {
                tracing::info!("shutdown requested; finishing in-flight work (signal again to exit at once)");
                cancel.cancel();
            } else {
                tracing::warn!("second signal: exiting now");
                std::process::exit(130);
            }
        }
    });
    token
}
