//! Binding, serving and stopping a gRPC port with the HTTP/2 settings a
//! gateway's long-lived connection needs: shared by the ext_proc port and
//! the health port.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::server::{Router, TcpIncoming};

use crate::config::Http2;
use crate::tls::TlsError;

/// How long `shutdown` waits for open streams before cutting them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("could not listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("the server task panicked")]
    Panicked,
}

/// A tonic server builder with kvpick's HTTP/2 settings.
pub fn builder(http2: &Http2) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(http2.max_concurrent_streams)
        .http2_max_pending_accept_reset_streams(Some(http2.max_pending_accept_reset_streams))
        .http2_max_local_error_reset_streams(http2.max_local_error_reset_streams)
        .http2_keepalive_interval(http2.keepalive_interval)
        .http2_keepalive_timeout(http2.keepalive_timeout)
        .tcp_nodelay(true)
}

/// Serves `router` on `listener` on the current tokio runtime until the
/// handle is shut down or dropped; `certificate_pem` is what
/// [`ServerHandle::certificate_pem`] reports.
pub fn spawn_router(
    router: Router,
    listener: TcpListener,
    certificate_pem: Option<String>,
) -> Result<ServerHandle, ServeError> {
    let local_addr = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr: SocketAddr::from(([0, 0, 0, 0], 0)), source })?;
    let (stop, stopped) = oneshot::channel::<()>();
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let task = tokio::spawn(async move {
        router
            .serve_with_incoming_shutdown(incoming, async {
                // A dropped handle stops the server too.
                let _ = stopped.await;
            })
            .await
            .map_err(ServeError::from)
    });
    Ok(ServerHandle { local_addr, certificate_pem, stop: Some(stop), task: Some(task) })
}

/// A running gRPC server.
#[derive(Debug)]
pub struct ServerHandle {
    local_addr: SocketAddr,
    certificate_pem: Option<String>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServeError>>>,
}

impl ServerHandle {
    /// Where it listens (the OS's port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The certificate it presents, PEM; `None` when plaintext.
    pub fn certificate_pem(&self) -> Option<&str> {
        self.certificate_pem.as_deref()
    }

    /// Stops accepting, lets open streams finish for a few seconds, then
    /// cuts them.
    pub async fn shutdown(self) -> Result<(), ServeError> {
        self.shutdown_within(SHUTDOWN_GRACE).await
    }

    /// Stops accepting, lets open streams finish for up to `grace`, then
    /// cuts them (dropping a stream frees its booking).
    pub async fn shutdown_within(mut self, grace: Duration) -> Result<(), ServeError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let Some(mut task) = self.task.take() else { return Ok(()) };
        match tokio::time::timeout(grace, &mut task).await {
            Ok(Ok(result)) => result,
            Ok(Err(join)) if join.is_panic() => Err(ServeError::Panicked),
            Ok(Err(_)) => Ok(()),
            Err(_) => {
                tracing::warn!(addr = %self.local_addr, "streams still open after the grace period; cutting them");
                task.abort();
                Ok(())
            }
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
