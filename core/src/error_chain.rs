//! An error with its causes on one line, for logs and for the messages
//! kvpick passes on: hyper's and libzmq's own messages are terse ("client
//! error (Connect)") and the cause is deeper in the chain.

use std::error::Error;

/// `error: cause: cause's cause`, outermost first.
pub fn error_chain(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn causes_follow_outermost_first() {
        let e = Outer(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused"));
        assert_eq!(error_chain(&e), "outer: refused");
    }
}
