//! A raw HTTP/2 gRPC client for the ext_proc service, for what a gateway
//! does and tonic's client cannot: reset one stream (RST_STREAM CANCEL)
//! mid-way while the connection lives on, or send a message that does not
//! decode. gRPC framing by hand: a 0 byte, a 4-byte big-endian length, the
//! protobuf.

use std::net::SocketAddr;

use bytes::{Buf, Bytes, BytesMut};
use h2::client::{ResponseFuture, SendRequest};
use h2::{Reason, RecvStream, SendStream};
use kvpick_proto::ext_proc::{ProcessingRequest, ProcessingResponse};
use prost::Message;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::WAIT;

const PATH: &str = "/envoy.service.ext_proc.v3.ExternalProcessor/Process";

/// One HTTP/2 connection; streams are opened on it one by one.
pub struct RawConnection {
    addr: SocketAddr,
    send: SendRequest<Bytes>,
    driver: JoinHandle<Result<(), h2::Error>>,
}

impl RawConnection {
    pub async fn connect(addr: SocketAddr) -> RawConnection {
        assert!(addr.ip().is_loopback());
        let tcp = TcpStream::connect(addr).await.expect("tcp connects");
        tcp.set_nodelay(true).expect("nodelay");
        let (send, connection) = h2::client::Builder::new()
            // Many streams reset by us may still see frames in flight.
            .max_concurrent_reset_streams(10_000)
            .handshake(tcp)
            .await
            .expect("h2 handshake");
        let driver = tokio::spawn(connection);
        RawConnection { addr, send, driver }
    }

    /// The connection is still up (no GOAWAY, no error).
    pub fn is_alive(&self) -> bool {
        !self.driver.is_finished()
    }

    /// Opens one ext_proc stream.
    pub async fn open(&self) -> RawCall {
        let mut send = self.send.clone().ready().await.expect("connection accepts a new stream");
        let request = http::Request::builder()
            .method("POST")
            .uri(format!("http://{}{PATH}", self.addr))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .expect("valid request");
        let (response, stream) = send.send_request(request, false).expect("stream opens");
        RawCall { send: stream, response: Some(response), body: None, buf: BytesMut::new() }
    }

    /// Ends the connection (after the test is done with it).
    pub fn close(self) {
        drop(self.send);
        self.driver.abort();
    }
}

pub struct RawCall {
    send: SendStream<Bytes>,
    response: Option<ResponseFuture>,
    body: Option<RecvStream>,
    buf: BytesMut,
}

impl RawCall {
    pub fn send(&mut self, message: &ProcessingRequest) {
        self.send_raw(&message.encode_to_vec());
    }

    /// One gRPC message whose payload is `payload` as is.
    pub fn send_raw(&mut self, payload: &[u8]) {
        let mut frame = Vec::with_capacity(5 + payload.len());
        frame.push(0);
        frame.extend_from_slice(&u32::try_from(payload.len()).expect("small message").to_be_bytes());
        frame.extend_from_slice(payload);
        self.send.send_data(Bytes::from(frame), false).expect("data sent");
    }

    /// The next answer.
    pub async fn recv(&mut self) -> ProcessingResponse {
        tokio::time::timeout(WAIT, self.recv_inner()).await.expect("an answer in time")
    }

    async fn recv_inner(&mut self) -> ProcessingResponse {
        if let Some(response) = self.response.take() {
            let response = response.await.expect("response headers");
            assert_eq!(response.status(), 200);
            self.body = Some(response.into_body());
        }
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
                if self.buf.len() >= 5 + len {
                    self.buf.advance(5);
                    let message = self.buf.split_to(len);
                    return ProcessingResponse::decode(message.freeze()).expect("answer decodes");
                }
            }
            let body = self.body.as_mut().expect("response started");
            let chunk = body.data().await.expect("stream still open").expect("data frame");
            body.flow_control().release_capacity(chunk.len()).expect("capacity released");
            self.buf.extend_from_slice(&chunk);
        }
    }

    /// Waits for the stream's end; returns its `grpc-status` (or `None`
    /// when it was reset instead).
    pub async fn status(&mut self) -> Option<String> {
        tokio::time::timeout(WAIT, async {
            if let Some(response) = self.response.take() {
                let response = response.await.ok()?;
                if let Some(status) = response.headers().get("grpc-status") {
                    return Some(status.to_str().unwrap_or("?").to_owned());
                }
                self.body = Some(response.into_body());
            }
            let body = self.body.as_mut()?;
            while let Some(data) = body.data().await {
                let data = data.ok()?;
                body.flow_control().release_capacity(data.len()).ok()?;
            }
            let trailers = body.trailers().await.ok()??;
            trailers.get("grpc-status").map(|s| s.to_str().unwrap_or("?").to_owned())
        })
        .await
        .expect("stream ends in time")
    }

    /// The gateway cancels: RST_STREAM(CANCEL) on this stream only.
    pub fn cancel(mut self) {
        self.send.send_reset(Reason::CANCEL);
    }
}
