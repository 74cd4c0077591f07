//! The process's reload and stop signals, registered once, before anything
//! slow: until a handler is registered a signal's default action applies,
//! and SIGHUP's and SIGTERM's is to end the process at once.

/// SIGHUP (reload) and SIGTERM / SIGINT (stop), held from registration on.
pub struct Signals {
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    /// Registers the handlers (inside a Tokio runtime).
    pub fn register() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Signals {
                hup: signal(SignalKind::hangup()).ok(),
                term: signal(SignalKind::terminate()).ok(),
                int: signal(SignalKind::interrupt()).ok(),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// The SIGHUP stream, for the task that reloads on it (taken once; a
    /// SIGHUP received before is delivered to it).
    #[cfg(unix)]
    pub fn take_hup(&mut self) -> Option<tokio::signal::unix::Signal> {
        self.hup.take()
    }

    /// Waits for SIGINT or SIGTERM (cancel-safe).
    pub async fn stop(&mut self) {
        #[cfg(unix)]
        {
            async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                _ = recv(&mut self.term) => {}
                _ = recv(&mut self.int) => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}
