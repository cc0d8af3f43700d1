//! Write-ahead log segments: decoding any bytes never panics, and the records it accepts
//! encode back to exactly the bytes they came from.
#![no_main]

use herald::store::wal::{decode_segment, encode_record, End};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (records, end) = decode_segment(data);
    let mut again = Vec::new();
    for r in &records {
        encode_record(r, &mut again);
    }
    let good = match end {
        End::Clean => again.len(),
        End::Torn { at } | End::Damaged { at, .. } => at as usize,
    };
    assert_eq!(again.len(), good);
    assert_eq!(&again[..], &data[..good]);
});
