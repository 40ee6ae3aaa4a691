//! An engine's KV-event publisher over real libzmq: PUB (as XPUB, to see
//! when a subscriber has joined) and a replay ROUTER, both on 127.0.0.1
//! with ports picked by the OS.

use std::time::Instant;

use kvpick_core::WorkerId;
use kvpick_kv_events::{END_SEQ, Publisher};

use super::WAIT;

/// How replay replies are framed (vLLM ≥ 0.26 adds the topic frame).
#[derive(Clone, Copy, Debug)]
pub enum ReplayLayout {
    WithTopic,
    Legacy,
}

pub struct TestPublisher {
    _ctx: zmq::Context,
    publish: zmq::Socket,
    replay: zmq::Socket,
    pub endpoint: String,
    pub replay_endpoint: String,
    pub topic: Vec<u8>,
    /// Every batch "published", in order, for replays.
    history: Vec<(u64, Vec<u8>)>,
}

/// Where a socket bound to `tcp://127.0.0.1:*` actually listens.
fn last_endpoint(socket: &zmq::Socket) -> String {
    socket.get_last_endpoint().expect("last endpoint").expect("endpoint is UTF-8")
}

impl TestPublisher {
    pub fn bind(topic: &str) -> Self {
        let mut publisher = TestPublisher::bind_at("tcp://127.0.0.1:*", "tcp://127.0.0.1:*");
        publisher.endpoint = last_endpoint(&publisher.publish);
        publisher.replay_endpoint = last_endpoint(&publisher.replay);
        publisher.topic = topic.into();
        publisher
    }

    /// What the ingest should subscribe to for `worker`.
    pub fn publisher(&self, worker: WorkerId, with_replay: bool) -> Publisher {
        Publisher {
            worker,
            endpoint: self.endpoint.clone(),
            replay_endpoint: with_replay.then(|| self.replay_endpoint.clone()),
            topic: self.topic.clone(),
        }
    }

    /// Blocks until a subscriber has subscribed (so nothing sent after is
    /// dropped by PUB's slow-joiner window).
    pub fn wait_subscribed(&self) {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            match self.publish.recv_bytes(0) {
                Ok(message) if message.first() == Some(&1) => return,
                Ok(_) => continue,
                Err(zmq::Error::EAGAIN) => break,
                Err(error) => panic!("XPUB receive failed: {error}"),
            }
        }
        panic!("no subscriber joined {} within {WAIT:?}", self.endpoint);
    }

    /// Records batch `seq` without sending it: a batch the subscriber missed.
    pub fn record(&mut self, seq: u64, payload: Vec<u8>) {
        self.history.push((seq, payload));
    }

    pub fn publish(&mut self, seq: u64, payload: Vec<u8>) {
        self.send_frames(&[&self.topic, &seq.to_be_bytes(), &payload]);
        self.record(seq, payload);
    }

    /// Sends raw frames on the PUB socket (possibly malformed).
    pub fn send_frames(&self, frames: &[&[u8]]) {
        self.publish.send_multipart(frames, 0).expect("publish");
    }

    /// Waits for one replay request and answers it from the history in
    /// `layout`, then the end marker. Returns the requested start seq.
    pub fn serve_replay(&self, layout: ReplayLayout) -> u64 {
        self.answer_replay(layout, usize::MAX)
    }

    /// Waits for one replay request and answers it with at most `n`
    /// batches and no end marker, as an engine whose ROUTER dropped the
    /// rest at its send high-water mark. Returns the requested start seq.
    pub fn serve_replay_cut_short(&self, layout: ReplayLayout, n: usize) -> u64 {
        self.answer_replay(layout, n)
    }

    fn answer_replay(&self, layout: ReplayLayout, most: usize) -> u64 {
        let request =
            self.replay.recv_multipart(0).unwrap_or_else(|e| panic!("no replay request within {WAIT:?}: {e}"));
        let [identity, delimiter, start] = request.as_slice() else { panic!("replay request frames: {request:?}") };
        assert!(delimiter.is_empty(), "DEALER must send an empty delimiter first");
        let start = u64::from_be_bytes(start.as_slice().try_into().expect("8-byte start seq"));
        let batches: Vec<&(u64, Vec<u8>)> = self.history.iter().filter(|(seq, _)| *seq >= start).collect();
        for (seq, payload) in batches.iter().take(most) {
            let seq = seq.to_be_bytes();
            let frames: Vec<&[u8]> = match layout {
                ReplayLayout::WithTopic => vec![identity, b"", &self.topic, &seq, payload],
                ReplayLayout::Legacy => vec![identity, b"", &seq, payload],
            };
            self.replay.send_multipart(frames, 0).expect("replay reply");
        }
        if batches.len() <= most {
            let end = END_SEQ.to_be_bytes();
            let marker: Vec<&[u8]> = match layout {
                ReplayLayout::WithTopic => vec![identity, b"", b"", &end, b""],
                ReplayLayout::Legacy => vec![identity, b"", &end, b""],
            };
            self.replay.send_multipart(marker, 0).expect("replay end marker");
        }
        start
    }

    /// Waits for one replay request and never answers it.
    pub fn ignore_replay(&self) -> u64 {
        let request =
            self.replay.recv_multipart(0).unwrap_or_else(|e| panic!("no replay request within {WAIT:?}: {e}"));
        u64::from_be_bytes(request[2].as_slice().try_into().expect("8-byte start seq"))
    }
}

impl TestPublisher {
    /// A publisher that restarted: bound again at the old one's endpoints
    /// (dropped first), with an empty history.
    pub fn rebind(endpoint: &str, replay_endpoint: &str, topic: &str) -> Self {
        let mut publisher = TestPublisher::bind_at(endpoint, replay_endpoint);
        publisher.topic = topic.into();
        publisher
    }

    fn bind_at(endpoint: &str, replay_endpoint: &str) -> Self {
        let ctx = zmq::Context::new();
        let publish = ctx.socket(zmq::XPUB).expect("XPUB socket");
        publish.set_linger(0).expect("linger");
        publish.set_xpub_verbose(true).expect("xpub verbose");
        publish.set_rcvtimeo(WAIT.as_millis() as i32).expect("rcvtimeo");
        publish.bind(endpoint).expect("bind on loopback");
        let replay = ctx.socket(zmq::ROUTER).expect("ROUTER socket");
        replay.set_linger(0).expect("linger");
        replay.set_rcvtimeo(WAIT.as_millis() as i32).expect("rcvtimeo");
        replay.bind(replay_endpoint).expect("bind on loopback");
        TestPublisher {
            _ctx: ctx,
            publish,
            replay,
            endpoint: endpoint.into(),
            replay_endpoint: replay_endpoint.into(),
            topic: Vec::new(),
            history: Vec::new(),
        }
    }
}
