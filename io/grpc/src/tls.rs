//! TLS on the ext_proc port: off by default (plaintext h2c inside the
//! cluster), a certificate given as PEM, or a self-signed one made at
//! start (what GAIE's reference EPP and Dynamo's do when asked for secure
//! serving without a certificate; gateways then skip verification).

use tonic::transport::{Identity, ServerTlsConfig};

use crate::config::Tls;

#[derive(Debug, thiserror::Error)]
#[error("could not make a self-signed certificate: {0}")]
pub struct TlsError(String);

/// The server's TLS settings, and the certificate PEM it presents (for a
/// client that wants to trust exactly it); `None` for plaintext.
pub fn server_tls(tls: &Tls) -> Result<Option<(ServerTlsConfig, String)>, TlsError> {
    let (cert, key) = match tls {
        Tls::Off => return Ok(None),
        Tls::Pem { cert, key } => (String::from_utf8_lossy(cert).into_owned(), key.clone()),
        Tls::SelfSigned { names } => {
            let names = if names.is_empty() { vec!["localhost".to_owned()] } else { names.clone() };
            let made = rcgen::generate_simple_self_signed(names).map_err(|e| TlsError(e.to_string()))?;
            (made.cert.pem(), made.signing_key.serialize_pem().into_bytes())
        }
    };
    let config = ServerTlsConfig::new().identity(Identity::from_pem(cert.as_bytes(), key));
    Ok(Some((config, cert)))
}
