//! The ZMQ framing of KV events, live and replayed.
//!
//! Live: exactly `[topic, seq (8-byte big-endian), payload]`. Replay replies,
//! as a DEALER receives them: `["", topic, seq, payload]` (vLLM ≥ 0.26,
//! TensorRT-LLM) or `["", seq, payload]` (older vLLM, SGLang), ended by
//! `["", "", END_SEQ, ""]` or `["", END_SEQ, ""]`.

/// Sequence number of the end-of-replay marker.
pub const END_SEQ: u64 = u64::MAX;

/// A live message, its topic dropped (the SUB socket filtered on it already).
#[derive(Debug, PartialEq, Eq)]
pub struct LiveMessage {
    pub seq: u64,
    pub payload: Vec<u8>,
}

/// One reply of a replay.
#[derive(Debug, PartialEq, Eq)]
pub enum ReplayReply {
    Batch { seq: u64, payload: Vec<u8> },
    End,
}

/// Why a message's frames were not understood; the message is skipped.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("{0} frames, expected 3 (topic, seq, payload)")]
    LiveFrameCount(usize),
    #[error("sequence frame of {0} bytes, expected 8")]
    SeqLength(usize),
    #[error("replay reply of {0} frames, expected 3 or 4 (delimiter, [topic,] seq, payload)")]
    ReplayFrameCount(usize),
    #[error("replay reply does not start with an empty delimiter frame")]
    MissingDelimiter,
    #[error("live message carries the end-of-replay sequence number")]
    EndSeqInLiveStream,
}

pub fn parse_live(mut frames: Vec<Vec<u8>>) -> Result<LiveMessage, FrameError> {
    if frames.len() != 3 {
        return Err(FrameError::LiveFrameCount(frames.len()));
    }
    let seq = parse_seq(&frames[1])?;
    if seq == END_SEQ {
        // Never a real batch: it would wedge the sequencer at the top.
        return Err(FrameError::EndSeqInLiveStream);
    }
    let payload = frames.pop().unwrap_or_default();
    Ok(LiveMessage { seq, payload })
}

pub fn parse_replay(mut frames: Vec<Vec<u8>>) -> Result<ReplayReply, FrameError> {
    // Frame 0 is the delimiter the ROUTER echoes; the topic frame, when
    // present, is ignored.
    let seq_frame = match frames.len() {
        3 => 1,
        4 => 2,
        n => return Err(FrameError::ReplayFrameCount(n)),
    };
    if !frames[0].is_empty() {
        return Err(FrameError::MissingDelimiter);
    }
    let seq = parse_seq(&frames[seq_frame])?;
    if seq == END_SEQ {
        return Ok(ReplayReply::End);
    }
    let payload = frames.pop().unwrap_or_default();
    Ok(ReplayReply::Batch { seq, payload })
}

fn parse_seq(frame: &[u8]) -> Result<u64, FrameError> {
    let bytes: [u8; 8] = frame.try_into().map_err(|_| FrameError::SeqLength(frame.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

/// The request a DEALER sends to a replay ROUTER: everything from `start`.
pub fn replay_request(start: u64) -> [Vec<u8>; 2] {
    [Vec::new(), start.to_be_bytes().to_vec()]
}

#[cfg(test)]
mod tests;
