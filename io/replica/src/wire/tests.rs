use std::sync::Arc;

use kvpick_core::booking::ReservationId;
use kvpick_core::hashing::SequenceHash;
use kvpick_core::replica::{Batch, Digest, Incarnation, LiveDigest, PeerBooking, PeerEvent, ReplicaId, Snapshot};
use kvpick_core::worker::WorkerId;

use super::*;

fn le(value: u64) -> Vec<u8> {
    value.to_le_bytes().to_vec()
}

fn booking() -> PeerBooking {
    PeerBooking {
        id: ReservationId(7),
        worker: WorkerId(8),
        seq_hashes: Arc::from(vec![SequenceHash(0x10), SequenceHash(0x11)]),
        unhashed_blocks: 1,
        prefill_tokens: 40,
        lease_left_ms: 300_000,
        prefill_done: false,
    }
}

/// The booking's bytes, written out field by field from `peer.proto`.
fn booking_bytes(seq_hashes_packed: bool) -> Vec<u8> {
    let mut bytes = [vec![0x09], le(7), vec![0x11], le(8)].concat();
    if seq_hashes_packed {
        bytes.extend([0x1a, 0x10]);
        bytes.extend([le(0x10), le(0x11)].concat());
    } else {
        // The unpacked form, which every protobuf reader must accept.
        bytes.extend([vec![0x19], le(0x10), vec![0x19], le(0x11)].concat());
    }
    bytes.extend([0x20, 0x01, 0x28, 0x28, 0x30, 0xe0, 0xa7, 0x12]);
    bytes
}

fn batch_bytes(seq_hashes_packed: bool) -> Vec<u8> {
    let booking = booking_bytes(seq_hashes_packed);
    let reserved = [vec![0x0a, booking.len() as u8], booking].concat();
    let freed = [vec![0x21], le(5)].concat();
    let batch = [
        vec![0x09],
        le(1),
        vec![0x11],
        le(2),
        vec![0x18, 0x03],
        vec![0x22, reserved.len() as u8],
        reserved,
        vec![0x22, freed.len() as u8],
        freed,
    ]
    .concat();
    [vec![0x0a, batch.len() as u8], batch].concat()
}

fn batch() -> Frame {
    Frame::Batch(Batch {
        sent_unix_micros: 0,
        origin: ReplicaId(1),
        incarnation: Incarnation(2),
        first_seq: 3,
        events: vec![PeerEvent::Reserved(booking()), PeerEvent::Freed(ReservationId(5))],
    })
}

#[test]
fn a_batch_encodes_to_the_bytes_the_schema_gives() {
    assert_eq!(encode(&batch()), batch_bytes(true));
    assert_eq!(decode(&batch_bytes(true), &Limits::default()), Ok(batch()));
    assert_eq!(decode(&batch_bytes(false), &Limits::default()), Ok(batch()));
    // The send time: field 5, fixed64, after the events (older senders
    // leave it out, and it decodes as 0).
    let Frame::Batch(mut timed) = batch() else { unreachable!() };
    timed.sent_unix_micros = 0x0102_0304_0506_0708;
    let mut bytes = batch_bytes(true);
    bytes[1] += 9;
    bytes.extend_from_slice(&[0x29, 0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01]);
    assert_eq!(encode(&Frame::Batch(timed.clone())), bytes);
    assert_eq!(decode(&bytes, &Limits::default()), Ok(Frame::Batch(timed)));
}

#[test]
fn a_digest_and_a_resync_request_encode_to_the_bytes_the_schema_gives() {
    let digest = Frame::Digest(Digest {
        origin: ReplicaId(1),
        incarnation: Incarnation(2),
        last_seq: 300,
        live: LiveDigest { live: 4, sum: 0xdead_beef },
    });
    let body =
        [vec![0x09], le(1), vec![0x11], le(2), vec![0x18, 0xac, 0x02, 0x20, 0x04, 0x29], le(0xdead_beef)].concat();
    let bytes = [vec![0x1a, body.len() as u8], body].concat();
    assert_eq!(encode(&digest), bytes);
    assert_eq!(decode(&bytes, &Limits::default()), Ok(digest));

    let resync = Frame::Resync(ResyncRequest { origin: ReplicaId(1), incarnation: Incarnation(2), from_seq: 9 });
    let body = [vec![0x09], le(1), vec![0x11], le(2), vec![0x18, 0x09]].concat();
    let bytes = [vec![0x22, body.len() as u8], body].concat();
    assert_eq!(encode(&resync), bytes);
    assert_eq!(decode(&bytes, &Limits::default()), Ok(resync));
}

#[test]
fn every_frame_kind_survives_a_round_trip() {
    let snapshot = Frame::Snapshot(Snapshot {
        origin: ReplicaId(1),
        incarnation: Incarnation(2),
        last_seq: 0,
        bookings: vec![booking(), PeerBooking { id: ReservationId(9), prefill_done: true, ..booking() }],
    });
    let events = Frame::Batch(Batch {
        sent_unix_micros: 0,
        origin: ReplicaId(u64::MAX),
        incarnation: Incarnation(u64::MAX),
        first_seq: u64::MAX - 3,
        events: vec![
            PeerEvent::PrefillComplete(ReservationId(0)),
            PeerEvent::Renewed { id: ReservationId(u64::MAX), lease_left_ms: 0 },
            PeerEvent::Freed(ReservationId(1)),
        ],
    });
    for frame in [snapshot, events, batch()] {
        assert_eq!(decode(&encode(&frame), &Limits::default()), Ok(frame));
    }
}

#[test]
fn fields_this_version_does_not_know_are_skipped() {
    // A newer peer's field 15 (varint) in the batch: ignored, as protobuf says.
    let mut bytes = batch_bytes(true);
    bytes[1] += 2;
    bytes.extend([0x78, 0x01]);
    assert_eq!(decode(&bytes, &Limits::default()), Ok(batch()));
}

#[test]
fn frames_no_replica_could_send_are_refused_with_their_reason() {
    let limits = Limits::default();
    let frame = batch_bytes(true);
    let small = Limits { max_frame_bytes: frame.len() - 1, ..limits };
    assert_eq!(decode(&frame, &small), Err(FrameError::TooLarge { bytes: frame.len(), max: frame.len() - 1 }));
    assert!(matches!(decode(&frame[..frame.len() - 1], &limits), Err(FrameError::Malformed(_))));
    assert_eq!(decode(&[], &limits), Err(FrameError::NoBody));
    // A body this version does not know (field 9) is no body.
    assert_eq!(decode(&[0x4a, 0x00], &limits), Err(FrameError::NoBody));
    // An event with no kind.
    let empty_event = [vec![0x0a, 0x16, 0x09], le(1), vec![0x11], le(2), vec![0x18, 0x01, 0x22, 0x00]].concat();
    assert_eq!(decode(&empty_event, &limits), Err(FrameError::NoEventKind { index: 0 }));

    let refused = |frame: Frame, limits: &Limits| decode(&encode(&frame), limits).unwrap_err();
    let Frame::Batch(good) = batch() else { unreachable!() };
    let no_origin = Frame::Batch(Batch { origin: ReplicaId(0), ..good.clone() });
    assert_eq!(refused(no_origin, &limits), FrameError::NoOrigin);
    let zero = Frame::Batch(Batch { first_seq: 0, ..good.clone() });
    assert_eq!(refused(zero, &limits), FrameError::BadSequence { first_seq: 0, events: 2 });
    let overflow = Frame::Batch(Batch { first_seq: u64::MAX, ..good.clone() });
    assert_eq!(refused(overflow, &limits), FrameError::BadSequence { first_seq: u64::MAX, events: 2 });
    let one_event = Limits { max_events_per_batch: 1, ..limits };
    assert_eq!(refused(batch(), &one_event).kind(), "over_cap");
    let short = Limits { max_blocks_per_booking: 2, ..limits };
    assert_eq!(
        refused(batch(), &short),
        FrameError::OverCap { what: "blocks of a booking", count: 3, max: 2 },
        "unhashed blocks count too"
    );
    let light = Limits { max_prefill_tokens: 39, ..limits };
    assert_eq!(refused(batch(), &light).kind(), "over_cap");
    let lone = Limits { max_bookings_per_snapshot: 0, ..limits };
    let snapshot = Frame::Snapshot(Snapshot {
        origin: ReplicaId(1),
        incarnation: Incarnation(1),
        last_seq: 0,
        bookings: vec![booking()],
    });
    assert_eq!(refused(snapshot, &lone).kind(), "over_cap");
    let resync = Frame::Resync(ResyncRequest { origin: ReplicaId(1), incarnation: Incarnation(1), from_seq: 0 });
    assert_eq!(refused(resync, &limits).kind(), "bad_sequence");
}

/// The fuzz target's seeds are written by hand from `peer.proto` (by
/// `fuzz/seeds/peer_frames.py`, apart from this encoder): every frame in
/// them must decode, and replaying each stream through an inbox must apply
/// every change once and leave the origin's bookings on known workers.
#[test]
fn the_hand_written_seed_frames_decode_and_replay_cleanly() {
    use kvpick_core::clock::Millis;
    use kvpick_core::replica::{ExactlyOnce, Inbox, InboxConfig};

    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/corpus/peer_frames");
    let mut seeds: Vec<_> = std::fs::read_dir(dir)
        .expect("the seed corpus")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.file_name().is_some_and(|name| name.to_string_lossy().starts_with("seed-")))
        .collect();
    seeds.sort();
    assert_eq!(seeds.len(), 6, "{seeds:?}");
    let known = |worker: WorkerId| worker.0 % 2 == 0;
    let mut kinds = std::collections::HashSet::new();
    for path in seeds {
        let data = std::fs::read(&path).expect("a seed");
        let mut inbox = Inbox::new(ReplicaId(1), InboxConfig::default());
        let mut shards = ExactlyOnce::default();
        let mut resyncs_asked = 0u64;
        let mut rest = &data[..];
        while !rest.is_empty() {
            let len = usize::from(u16::from_le_bytes([rest[0], rest[1]]));
            let frame =
                decode(&rest[2..2 + len], &Limits::default()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            rest = &rest[2 + len..];
            let apply = match &frame {
                Frame::Batch(batch) => {
                    let received = inbox.receive(batch, Millis(1), known);
                    resyncs_asked += u64::from(received.resync_from.is_some());
                    received.apply
                }
                Frame::Snapshot(snapshot) => inbox.resync(snapshot, Millis(1), known),
                Frame::Digest(digest) => {
                    let received = inbox.check(digest);
                    resyncs_asked += u64::from(received.resync_from.is_some());
                    received.apply
                }
                Frame::Resync(_) | Frame::SnapshotPart(_) => vec![],
            };
            kinds.insert(std::mem::discriminant(&frame));
            shards.apply(&apply).unwrap_or_else(|defect| panic!("{}: {defect}", path.display()));
        }
        assert!(shards.live.values().all(|(worker, _)| known(*worker)));
        // The gap and digest seeds must make the inbox ask for a snapshot.
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let should_ask = name.contains("gap") || name.contains("digests");
        assert_eq!(resyncs_asked > 0, should_ask, "{name}: {resyncs_asked} resyncs asked");
        if name.contains("restart") {
            assert_eq!(inbox.stats().new_incarnations, 1, "{name}");
        }
    }
    assert_eq!(kinds.len(), 4, "every frame kind is seeded");
}

#[test]
fn a_frame_of_many_tiny_entries_is_refused_before_it_is_decoded() {
    // 5,000 empty events: 10 kB on the wire, ~40 times that decoded.
    let events: Vec<u8> = std::iter::repeat_n([0x22u8, 0x00], 5_000).flatten().collect();
    let body = [[vec![0x09], le(1), vec![0x11], le(2), vec![0x18, 0x01]].concat(), events].concat();
    let mut bytes = vec![0x0a];
    prost::encoding::encode_varint(body.len() as u64, &mut bytes);
    bytes.extend(body);
    assert_eq!(
        decode(&bytes, &Limits::default()),
        Err(FrameError::OverCap { what: "events of a batch", count: 5_000, max: 4_096 })
    );
    // A length running past the end is malformed, not a panic.
    assert!(matches!(decode(&[0x0a, 0x05, 0x22, 0x09], &Limits::default()), Err(FrameError::Malformed(_))));
    assert!(matches!(decode(&[0x0a, 0x02, 0x09, 0x01], &Limits::default()), Err(FrameError::Malformed(_))));
    // A snapshot after which nothing could be numbered.
    let snapshot = Frame::Snapshot(Snapshot {
        origin: ReplicaId(1),
        incarnation: Incarnation(1),
        last_seq: u64::MAX,
        bookings: vec![],
    });
    assert_eq!(decode(&encode(&snapshot), &Limits::default()).unwrap_err().kind(), "bad_sequence");
}

fn snapshot_of(n: u64) -> Snapshot {
    let bookings = (0..n).map(|i| PeerBooking { id: ReservationId(100 + i), ..booking() }).collect();
    Snapshot { origin: ReplicaId(1), incarnation: Incarnation(2), last_seq: 9, bookings }
}

#[test]
fn a_large_snapshot_goes_in_parts_and_comes_back_whole() {
    let limits = Limits { max_bookings_per_snapshot: 4, ..Limits::default() };
    let snapshot = snapshot_of(10);
    let frames = encode_snapshot(&snapshot, &limits);
    assert_eq!(frames.len(), 3, "4 + 4 + 2 bookings");
    // The last part: fields 5 and 6 (varints) after the bookings.
    let last = &frames[2];
    assert!(last.ends_with(&[0x28, 0x02, 0x30, 0x03]), "part 2 of 3: {last:02x?}");
    let mut parts = SnapshotParts::default();
    let mut out = Vec::new();
    for bytes in &frames {
        let frame = decode(bytes, &limits).expect("a part decodes");
        assert!(matches!(&frame, Frame::SnapshotPart(p) if p.parts == 3));
        out.extend(parts.take(frame).expect("parts in order"));
    }
    assert_eq!(out, vec![Frame::Snapshot(snapshot.clone())]);
    // One frame when it fits; a frame by the byte budget as well.
    assert_eq!(encode_snapshot(&snapshot, &Limits::default()).len(), 1);
    let tight = Limits { max_frame_bytes: 600, ..Limits::default() };
    assert!(encode_snapshot(&snapshot, &tight).len() > 3);
}

#[test]
fn broken_snapshot_parts_are_dropped_not_applied() {
    let limits = Limits { max_bookings_per_snapshot: 4, ..Limits::default() };
    let frames: Vec<Frame> =
        encode_snapshot(&snapshot_of(10), &limits).iter().map(|b| decode(b, &limits).expect("decodes")).collect();
    // A lost middle part: the last one completes nothing.
    let mut parts = SnapshotParts::default();
    assert_eq!(parts.take(frames[0].clone()), Ok(None));
    assert_eq!(parts.take(frames[2].clone()), Ok(None));
    // Another frame between parts passes and drops what was gathered.
    assert_eq!(parts.take(frames[0].clone()), Ok(None));
    assert_eq!(parts.take(batch()), Ok(Some(batch())));
    assert_eq!(parts.take(frames[1].clone()), Ok(None));
    assert_eq!(parts.take(frames[2].clone()), Ok(None));
    // A part numbered past its count is refused when decoded.
    let Frame::SnapshotPart(mut bad) = frames[1].clone() else { unreachable!() };
    bad.part = 3;
    let bytes = encode(&Frame::SnapshotPart(bad));
    assert_eq!(decode(&bytes, &limits), Err(FrameError::BadPart { part: 3, parts: 3 }));
}

#[test]
fn snapshot_parts_are_capped_in_bytes_as_well_as_bookings() {
    // 300 bookings of 65,536 hashes each (one shared allocation): about
    // 150 MiB a part on the wire, 300 MiB for two.
    let hashes: Arc<[SequenceHash]> = Arc::from(vec![SequenceHash(1); 65_536]);
    let big = PeerBooking { seq_hashes: hashes, ..booking() };
    let part = |part: u32| {
        let bookings = (0..300).map(|i| PeerBooking { id: ReservationId(i), ..big.clone() }).collect();
        let snapshot = Snapshot { origin: ReplicaId(1), incarnation: Incarnation(2), last_seq: 9, bookings };
        Frame::SnapshotPart(SnapshotPart { snapshot, part, parts: 3 })
    };
    let mut parts = SnapshotParts::default();
    assert_eq!(parts.take(part(0)), Ok(None));
    assert!(matches!(parts.take(part(1)), Err(FrameError::OverCap { what: "bytes of a snapshot in parts", .. })));
}
