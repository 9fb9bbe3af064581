//! The ABI's decoders read buffers the other side of the host/plugin boundary wrote: a broken
//! or hostile plugin (or host) gets a refusal from them, never a panic or a huge allocation.

use concord_plugin_abi::{decode_batch, decode_pairs, encode_batch, encode_pairs};

#[test]
fn hostile_buffers_are_refused_never_a_panic() {
    let mut batch = Vec::new();
    let commands: [&[u8]; 3] = [b"one", b"", &[9; 70]];
    encode_batch(commands.iter().copied(), &mut batch);
    let mut pairs = Vec::new();
    encode_pairs(&[("key", "value"), ("k2", "")], &mut pairs);
    assert_eq!(decode_batch(&batch).unwrap().len(), 3);
    assert_eq!(decode_pairs(&pairs).unwrap().len(), 2);
    for input in concord_storage::testing::hostile_inputs(&[batch, pairs], 11, 3_000) {
        let _ = decode_batch(&input);
        let _ = decode_pairs(&input);
    }
}
