use super::*;

fn be(seq: u64) -> Vec<u8> {
    seq.to_be_bytes().to_vec()
}

#[test]
fn live_message_needs_exactly_three_frames_and_an_eight_byte_seq() {
    let ok = parse_live(vec![b"kv".to_vec(), be(7), b"pl".to_vec()]);
    assert_eq!(ok, Ok(LiveMessage { seq: 7, payload: b"pl".to_vec() }));
    assert_eq!(parse_live(vec![be(7), b"pl".to_vec()]), Err(FrameError::LiveFrameCount(2)));
    assert_eq!(parse_live(vec![vec![]; 4]), Err(FrameError::LiveFrameCount(4)));
    assert_eq!(parse_live(vec![vec![], vec![0; 7], vec![]]), Err(FrameError::SeqLength(7)));
    assert_eq!(parse_live(vec![vec![], be(END_SEQ), vec![]]), Err(FrameError::EndSeqInLiveStream));
}

#[test]
fn replay_replies_in_both_layouts() {
    let with_topic = parse_replay(vec![vec![], b"kv".to_vec(), be(3), b"pl".to_vec()]);
    assert_eq!(with_topic, Ok(ReplayReply::Batch { seq: 3, payload: b"pl".to_vec() }));
    let legacy = parse_replay(vec![vec![], be(3), b"pl".to_vec()]);
    assert_eq!(legacy, Ok(ReplayReply::Batch { seq: 3, payload: b"pl".to_vec() }));
    assert_eq!(parse_replay(vec![vec![], vec![], be(END_SEQ), vec![]]), Ok(ReplayReply::End));
    assert_eq!(parse_replay(vec![vec![], be(END_SEQ), vec![]]), Ok(ReplayReply::End));
}

#[test]
fn malformed_replay_replies() {
    assert_eq!(parse_replay(vec![vec![], be(3)]), Err(FrameError::ReplayFrameCount(2)));
    assert_eq!(parse_replay(vec![b"x".to_vec(), be(3), vec![]]), Err(FrameError::MissingDelimiter));
    assert_eq!(parse_replay(vec![vec![], vec![1, 2], vec![]]), Err(FrameError::SeqLength(2)));
}

#[test]
fn replay_request_is_delimiter_and_big_endian_start() {
    assert_eq!(replay_request(5), [vec![], vec![0, 0, 0, 0, 0, 0, 0, 5]]);
}
