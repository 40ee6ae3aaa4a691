//! `kvpick.peer.v1` frames to core's replica values and back.

use std::sync::Arc;

use kvpick_core::booking::ReservationId;
use kvpick_core::hashing::SequenceHash;
use kvpick_core::replica::{Batch, Digest, Incarnation, LiveDigest, PeerBooking, PeerEvent, ReplicaId, Snapshot};
use kvpick_core::worker::WorkerId;
use kvpick_proto::peer as pb;
use prost::Message;

mod index;
#[cfg(test)]
mod tests;

pub use index::{IndexLimits, IndexPiece, WorkerIndex, WorkerParts, decode_piece, encode_end, encode_worker};

/// How much one frame may claim. A peer is trusted with bookings, not
/// with this replica's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Checked before decoding.
    pub max_frame_bytes: usize,
    pub max_events_per_batch: usize,
    pub max_bookings_per_snapshot: usize,
    /// A prompt's blocks, hashed or not: 65,536 blocks of 16 tokens is a
    /// million tokens.
    pub max_blocks_per_booking: usize,
    /// Prefill tokens one booking may claim.
    pub max_prefill_tokens: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: 16 << 20,
            max_events_per_batch: 4096,
            max_bookings_per_snapshot: 65_536,
            max_blocks_per_booking: 65_536,
            max_prefill_tokens: 1 << 24,
        }
    }
}

/// Asks `origin` for a snapshot of its live bookings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResyncRequest {
    pub origin: ReplicaId,
    pub incarnation: Incarnation,
    /// The asker holds the origin's events before this one.
    pub from_seq: u64,
}

/// One decoded, validated frame.
#[derive(Clone, Debug, PartialEq)]
pub enum Frame {
    Batch(Batch),
    Snapshot(Snapshot),
    Digest(Digest),
    Resync(ResyncRequest),
    /// Part of a snapshot sent in several frames (`SnapshotParts` puts
    /// them together).
    SnapshotPart(SnapshotPart),
}

/// Some of a snapshot's bookings: part `part` of `parts`.
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotPart {
    pub snapshot: Snapshot,
    pub part: u32,
    pub parts: u32,
}

/// Why a frame was refused (nothing of it is applied).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {bytes} bytes is over the {max}-byte cap")]
    TooLarge { bytes: usize, max: usize },
    #[error("frame is not a kvpick.peer.v1 PeerFrame: {0}")]
    Malformed(String),
    #[error("frame has no body (or one this version does not know)")]
    NoBody,
    #[error("event {index} of the batch has no kind (or one this version does not know)")]
    NoEventKind { index: usize },
    #[error("{what} of {count} is over the cap of {max}")]
    OverCap { what: &'static str, count: usize, max: usize },
    #[error("sequence number {first_seq} with {events} events is not possible (numbers start at 1)")]
    BadSequence { first_seq: u64, events: usize },
    #[error("origin 0 or incarnation 0 is not a replica")]
    NoOrigin,
    #[error("snapshot part {part} of {parts} is not possible (parts count from 0)")]
    BadPart { part: u32, parts: u32 },
}

impl FrameError {
    /// A short name for a metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            FrameError::TooLarge { .. } => "too_large",
            FrameError::Malformed(_) => "malformed",
            FrameError::NoBody => "no_body",
            FrameError::NoEventKind { .. } => "no_event_kind",
            FrameError::OverCap { .. } => "over_cap",
            FrameError::BadSequence { .. } => "bad_sequence",
            FrameError::NoOrigin => "no_origin",
            FrameError::BadPart { .. } => "bad_part",
        }
    }
}

pub fn encode(frame: &Frame) -> Vec<u8> {
    let body = match frame {
        Frame::Batch(batch) => pb::peer_frame::Body::Batch(pb::Batch {
            origin: batch.origin.0,
            incarnation: batch.incarnation.0,
            first_seq: batch.first_seq,
            events: batch.events.iter().map(event_to_pb).collect(),
            sent_unix_micros: batch.sent_unix_micros,
        }),
        Frame::Snapshot(snapshot) => snapshot_to_pb(snapshot, &snapshot.bookings, 0, 0),
        Frame::SnapshotPart(p) => snapshot_to_pb(&p.snapshot, &p.snapshot.bookings, p.part, p.parts),
        Frame::Digest(digest) => pb::peer_frame::Body::Digest(pb::Digest {
            origin: digest.origin.0,
            incarnation: digest.incarnation.0,
            last_seq: digest.last_seq,
            live: digest.live.live,
            sum: digest.live.sum,
        }),
        Frame::Resync(request) => pb::peer_frame::Body::Resync(pb::ResyncRequest {
            origin: request.origin.0,
            incarnation: request.incarnation.0,
            from_seq: request.from_seq,
        }),
    };
    pb::PeerFrame { body: Some(body) }.encode_to_vec()
}

fn snapshot_to_pb(snapshot: &Snapshot, bookings: &[PeerBooking], part: u32, parts: u32) -> pb::peer_frame::Body {
    pb::peer_frame::Body::Snapshot(pb::Snapshot {
        origin: snapshot.origin.0,
        incarnation: snapshot.incarnation.0,
        last_seq: snapshot.last_seq,
        bookings: bookings.iter().map(booking_to_pb).collect(),
        part,
        parts,
    })
}

/// A snapshot's frames: one, or consecutive parts when its bookings are
/// more than a frame may hold (half the frame cap, by their size on the
/// wire, and the per-frame booking cap).
pub fn encode_snapshot(snapshot: &Snapshot, limits: &Limits) -> Vec<Vec<u8>> {
    let budget = limits.max_frame_bytes / 2;
    let mut chunks: Vec<&[PeerBooking]> = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, booking) in snapshot.bookings.iter().enumerate() {
        let size = 64 + 8 * booking.seq_hashes.len();
        if i > start && (i - start == limits.max_bookings_per_snapshot || bytes + size > budget) {
            chunks.push(&snapshot.bookings[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    chunks.push(&snapshot.bookings[start..]);
    if chunks.len() == 1 {
        return vec![encode(&Frame::Snapshot(snapshot.clone()))];
    }
    let parts = u32::try_from(chunks.len()).unwrap_or(u32::MAX);
    chunks
        .iter()
        .enumerate()
        .map(|(i, bookings)| {
            let body = snapshot_to_pb(snapshot, bookings, i as u32, parts);
            pb::PeerFrame { body: Some(body) }.encode_to_vec()
        })
        .collect()
}

/// Puts one stream's snapshot parts together. Parts arrive consecutively
/// (a sender writes them in one go); anything else between them, a part
/// out of order or of another snapshot drops the one being gathered (the
/// peer asks again), and the bookings of all parts are capped.
#[derive(Debug, Default)]
pub struct SnapshotParts {
    gathering: Option<SnapshotPart>,
    /// The gathered bookings' size on the wire, near enough.
    bytes: usize,
}

impl SnapshotParts {
    /// Most bookings a snapshot in parts may hold.
    pub const MAX_BOOKINGS: usize = 1 << 20;
    /// Most bytes of bookings it may hold (what 16 full frames carry): a
    /// peer cannot make this replica buffer more.
    pub const MAX_BYTES: usize = 256 << 20;

    /// A snapshot's first parts are held, waiting for the rest.
    pub fn gathering(&self) -> bool {
        self.gathering.is_some()
    }

    /// Passes `frame` on, keeps a part, or gives the snapshot its last
    /// part completes.
    pub fn take(&mut self, frame: Frame) -> Result<Option<Frame>, FrameError> {
        let Frame::SnapshotPart(part) = frame else {
            self.gathering = None;
            return Ok(Some(frame));
        };
        let follows = |held: &SnapshotPart| {
            held.snapshot.origin == part.snapshot.origin
                && held.snapshot.incarnation == part.snapshot.incarnation
                && held.snapshot.last_seq == part.snapshot.last_seq
                && held.parts == part.parts
                && held.part + 1 == part.part
        };
        let size: usize = part.snapshot.bookings.iter().map(|b| 64 + 8 * b.seq_hashes.len()).sum();
        match self.gathering.take() {
            None if part.part == 0 => {
                self.bytes = size;
                self.gathering = Some(part);
            }
            Some(mut held) if follows(&held) => {
                self.bytes += size;
                if self.bytes > Self::MAX_BYTES {
                    return Err(FrameError::OverCap {
                        what: "bytes of a snapshot in parts",
                        count: self.bytes,
                        max: Self::MAX_BYTES,
                    });
                }
                let total = held.snapshot.bookings.len() + part.snapshot.bookings.len();
                if total > Self::MAX_BOOKINGS {
                    return Err(FrameError::OverCap {
                        what: "bookings of a snapshot in parts",
                        count: total,
                        max: Self::MAX_BOOKINGS,
                    });
                }
                held.snapshot.bookings.extend(part.snapshot.bookings);
                held.part = part.part;
                if held.part + 1 == held.parts {
                    return Ok(Some(Frame::Snapshot(held.snapshot)));
                }
                self.gathering = Some(held);
            }
            // Out of order: this part can only start a new snapshot.
            _ if part.part == 0 => {
                self.bytes = size;
                self.gathering = Some(part);
            }
            _ => {}
        }
        Ok(None)
    }
}

pub fn decode(bytes: &[u8], limits: &Limits) -> Result<Frame, FrameError> {
    if bytes.len() > limits.max_frame_bytes {
        return Err(FrameError::TooLarge { bytes: bytes.len(), max: limits.max_frame_bytes });
    }
    // Decoded messages take up to ~40 times their wire size (an empty
    // event is 2 bytes on the wire): count a batch's events and a
    // snapshot's bookings before anything is allocated for them.
    let (what, count, max) = match repeated_entries(bytes)? {
        Some((BATCH, count)) => ("events of a batch", count, limits.max_events_per_batch),
        Some((_, count)) => ("bookings of a snapshot", count, limits.max_bookings_per_snapshot),
        None => ("", 0, 0),
    };
    cap(what, count, max)?;
    let frame = pb::PeerFrame::decode(bytes).map_err(|e| FrameError::Malformed(e.to_string()))?;
    match frame.body.ok_or(FrameError::NoBody)? {
        pb::peer_frame::Body::Batch(batch) => {
            let (origin, incarnation) = replica(batch.origin, batch.incarnation)?;
            cap("events of a batch", batch.events.len(), limits.max_events_per_batch)?;
            let in_range = batch.first_seq > 0 && batch.first_seq.checked_add(batch.events.len() as u64).is_some();
            if !in_range {
                return Err(FrameError::BadSequence { first_seq: batch.first_seq, events: batch.events.len() });
            }
            let events = batch
                .events
                .into_iter()
                .enumerate()
                .map(|(index, event)| event_from_pb(index, event, limits))
                .collect::<Result<_, _>>()?;
            Ok(Frame::Batch(Batch {
                origin,
                incarnation,
                first_seq: batch.first_seq,
                events,
                sent_unix_micros: batch.sent_unix_micros,
            }))
        }
        pb::peer_frame::Body::Snapshot(snapshot) => {
            let (origin, incarnation) = replica(snapshot.origin, snapshot.incarnation)?;
            if snapshot.last_seq == u64::MAX {
                // Nothing could be numbered after it.
                return Err(FrameError::BadSequence { first_seq: u64::MAX, events: 0 });
            }
            cap("bookings of a snapshot", snapshot.bookings.len(), limits.max_bookings_per_snapshot)?;
            if snapshot.parts > 1 && snapshot.part >= snapshot.parts {
                return Err(FrameError::BadPart { part: snapshot.part, parts: snapshot.parts });
            }
            let bookings =
                snapshot.bookings.into_iter().map(|b| booking_from_pb(b, limits)).collect::<Result<_, _>>()?;
            let whole = Snapshot { origin, incarnation, last_seq: snapshot.last_seq, bookings };
            if snapshot.parts > 1 {
                return Ok(Frame::SnapshotPart(SnapshotPart {
                    snapshot: whole,
                    part: snapshot.part,
                    parts: snapshot.parts,
                }));
            }
            Ok(Frame::Snapshot(whole))
        }
        pb::peer_frame::Body::Digest(digest) => {
            let (origin, incarnation) = replica(digest.origin, digest.incarnation)?;
            let live = LiveDigest { live: digest.live, sum: digest.sum };
            Ok(Frame::Digest(Digest { origin, incarnation, last_seq: digest.last_seq, live }))
        }
        pb::peer_frame::Body::Resync(request) => {
            let (origin, incarnation) = replica(request.origin, request.incarnation)?;
            if request.from_seq == 0 {
                return Err(FrameError::BadSequence { first_seq: 0, events: 0 });
            }
            Ok(Frame::Resync(ResyncRequest { origin, incarnation, from_seq: request.from_seq }))
        }
    }
}

/// `PeerFrame` fields holding a batch and a snapshot; in both, field 4 is
/// the repeated one (events, bookings).
const BATCH: u32 = 1;
const SNAPSHOT: u32 = 2;
const REPEATED: u32 = 4;

/// For a batch or a snapshot frame: which, and how many entries its
/// repeated field has (the last body wins, as protobuf merges them; a
/// frame of several bodies is counted by its largest). Walks the wire
/// format without decoding anything.
fn repeated_entries(bytes: &[u8]) -> Result<Option<(u32, usize)>, FrameError> {
    let mut found = None;
    for field in fields(bytes) {
        let (tag, body) = field?;
        if let (BATCH | SNAPSHOT, Some(body)) = (tag, body) {
            let mut count = 0usize;
            for inner in fields(body) {
                count += usize::from(inner?.0 == REPEATED);
            }
            found = Some(found.map_or((tag, count), |(_, most): (u32, usize)| (tag, most.max(count))));
        }
    }
    Ok(found)
}

/// The fields of one message level: (field number, body if
/// length-delimited).
fn fields(mut bytes: &[u8]) -> impl Iterator<Item = Result<(u32, Option<&[u8]>), FrameError>> {
    use prost::encoding::{WireType, decode_key, decode_varint};
    let malformed = |e: prost::DecodeError| FrameError::Malformed(e.to_string());
    std::iter::from_fn(move || {
        if bytes.is_empty() {
            return None;
        }
        let mut next = || -> Result<(u32, Option<&[u8]>), FrameError> {
            let (tag, wire_type) = decode_key(&mut bytes).map_err(malformed)?;
            let skip = match wire_type {
                WireType::Varint => {
                    decode_varint(&mut bytes).map_err(malformed)?;
                    0
                }
                WireType::SixtyFourBit => 8,
                WireType::ThirtyTwoBit => 4,
                WireType::LengthDelimited => {
                    let len = decode_varint(&mut bytes).map_err(malformed)?;
                    let len = usize::try_from(len).ok().filter(|len| *len <= bytes.len());
                    let len = len.ok_or_else(|| FrameError::Malformed("a length past the frame's end".into()))?;
                    let (body, rest) = bytes.split_at(len);
                    bytes = rest;
                    return Ok((tag, Some(body)));
                }
                WireType::StartGroup | WireType::EndGroup => 0,
            };
            if skip > bytes.len() {
                return Err(FrameError::Malformed("a field past the frame's end".into()));
            }
            bytes = &bytes[skip..];
            Ok((tag, None))
        };
        let item = next();
        if item.is_err() {
            bytes = &[];
        }
        Some(item)
    })
}

fn replica(origin: u64, incarnation: u64) -> Result<(ReplicaId, Incarnation), FrameError> {
    // Zero is what an absent field decodes to: a frame without them.
    if origin == 0 || incarnation == 0 {
        return Err(FrameError::NoOrigin);
    }
    Ok((ReplicaId(origin), Incarnation(incarnation)))
}

fn cap(what: &'static str, count: usize, max: usize) -> Result<(), FrameError> {
    if count > max {
        return Err(FrameError::OverCap { what, count, max });
    }
    Ok(())
}

fn event_to_pb(event: &PeerEvent) -> pb::Event {
    let kind = match event {
        PeerEvent::Reserved(booking) => pb::event::Kind::Reserved(booking_to_pb(booking)),
        PeerEvent::PrefillComplete(id) => pb::event::Kind::PrefillComplete(id.0),
        PeerEvent::Renewed { id, lease_left_ms } => {
            pb::event::Kind::Renewed(pb::Renewed { id: id.0, lease_left_ms: *lease_left_ms })
        }
        PeerEvent::Freed(id) => pb::event::Kind::Freed(id.0),
    };
    pb::Event { kind: Some(kind) }
}

fn event_from_pb(index: usize, event: pb::Event, limits: &Limits) -> Result<PeerEvent, FrameError> {
    Ok(match event.kind.ok_or(FrameError::NoEventKind { index })? {
        pb::event::Kind::Reserved(booking) => PeerEvent::Reserved(booking_from_pb(booking, limits)?),
        pb::event::Kind::PrefillComplete(id) => PeerEvent::PrefillComplete(ReservationId(id)),
        pb::event::Kind::Renewed(renewed) => {
            PeerEvent::Renewed { id: ReservationId(renewed.id), lease_left_ms: renewed.lease_left_ms }
        }
        pb::event::Kind::Freed(id) => PeerEvent::Freed(ReservationId(id)),
    })
}

fn booking_to_pb(booking: &PeerBooking) -> pb::Booking {
    pb::Booking {
        id: booking.id.0,
        worker: booking.worker.0,
        seq_hashes: booking.seq_hashes.iter().map(|h| h.0).collect(),
        unhashed_blocks: booking.unhashed_blocks,
        prefill_tokens: booking.prefill_tokens,
        lease_left_ms: booking.lease_left_ms,
        prefill_done: booking.prefill_done,
    }
}

fn booking_from_pb(booking: pb::Booking, limits: &Limits) -> Result<PeerBooking, FrameError> {
    // Both count: unhashed blocks are booked as load too.
    let blocks = booking.seq_hashes.len().saturating_add(booking.unhashed_blocks as usize);
    cap("blocks of a booking", blocks, limits.max_blocks_per_booking)?;
    cap("prefill tokens of a booking", booking.prefill_tokens as usize, limits.max_prefill_tokens as usize)?;
    Ok(PeerBooking {
        id: ReservationId(booking.id),
        worker: WorkerId(booking.worker),
        seq_hashes: booking.seq_hashes.into_iter().map(SequenceHash).collect::<Arc<[_]>>(),
        unhashed_blocks: booking.unhashed_blocks,
        prefill_tokens: booking.prefill_tokens,
        lease_left_ms: booking.lease_left_ms,
        prefill_done: booking.prefill_done,
    })
}
