//! Mutual TLS between replicas: each presents its own certificate and
//! accepts only a peer whose certificate the pool's CA signed, both when
//! it dials and when it is dialed. The shared token can be on as well;
//! either is enough to keep a stranger's bookings out.

use std::fmt;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

/// A handshake not done by then is dropped: a half-open connection must
/// not hold a slot on the peer port.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// This replica's certificate and key and the CA that signs every
/// replica's, as PEM (a `kubernetes.io/tls` Secret's `tls.crt`, `tls.key`
/// and `ca.crt`, as cert-manager issues them).
#[derive(Clone)]
pub struct PeerTls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub ca_pem: Vec<u8>,
    /// The name a peer's certificate must carry; `None`: the address
    /// dialed (the certificate then needs the pod's IP among its names).
    /// Certificates issued for a headless Service usually carry its DNS
    /// name, and every replica then checks its peers against that name.
    pub server_name: Option<String>,
}

/// The key stays out of logs.
impl fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerTls")
            .field("cert_bytes", &self.cert_pem.len())
            .field("ca_bytes", &self.ca_pem.len())
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("peer TLS: {0}")]
pub struct PeerTlsError(String);

impl PeerTls {
    /// The peer port's side: its certificate, and a client certificate
    /// signed by the CA required of every caller.
    pub fn server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
            .client_ca_root(Certificate::from_pem(&self.ca_pem))
            .timeout(HANDSHAKE_TIMEOUT)
    }

    /// The dialing side: trusts only the CA, and presents this replica's
    /// certificate.
    pub fn client(&self) -> ClientTlsConfig {
        let config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
            .timeout(HANDSHAKE_TIMEOUT);
        match &self.server_name {
            Some(name) => config.domain_name(name.clone()),
            None => config,
        }
    }

    /// Parses both sides now, so a wrong file stops the start with a
    /// reason instead of failing every connection later.
    pub fn check(&self) -> Result<(), PeerTlsError> {
        let has = |pem: &[u8], what: &str| String::from_utf8_lossy(pem).contains(&format!("-----BEGIN {what}"));
        if !has(&self.cert_pem, "CERTIFICATE") {
            return Err(PeerTlsError("the certificate holds no PEM CERTIFICATE block".into()));
        }
        if !has(&self.ca_pem, "CERTIFICATE") {
            return Err(PeerTlsError("the CA holds no PEM CERTIFICATE block".into()));
        }
        if !String::from_utf8_lossy(&self.key_pem).contains("PRIVATE KEY-----") {
            return Err(PeerTlsError("the key holds no PEM PRIVATE KEY block".into()));
        }
        tonic::transport::Server::builder()
            .tls_config(self.server())
            .map_err(|e| PeerTlsError(format!("the certificate, key or CA is not usable to serve: {e}")))?;
        Endpoint::from_static("https://127.0.0.1:1")
            .tls_config(self.client())
            .map_err(|e| PeerTlsError(format!("the certificate, key or CA is not usable to dial: {e}")))?;
        Ok(())
    }
}
