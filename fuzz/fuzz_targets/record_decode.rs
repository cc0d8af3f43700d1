//! Any bytes as a stored record (what a torn write or a foreign file could leave): decoding is
//! an error or a value, never a panic or a huge allocation.
#![no_main]

use herald::model::{Failure, Message, Run};
use herald::store::codec::{decode, encode};
use herald::store::records::{LiveEntry, ProgressRecord, SpecRecord};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode::<SpecRecord>("specs", b"k", data);
    let _ = decode::<ProgressRecord>("progress", b"k", data);
    let _ = decode::<LiveEntry>("live", b"k", data);
    let _ = decode::<Message>("messages", b"k", data);
    let _ = decode::<Failure>("failures", b"k", data);
    if let Ok(run) = decode::<Run>("runs", b"k", data) {
        // Whatever decodes re-encodes to something that decodes to the same value.
        let again = encode(&run).expect("encode");
        assert_eq!(
            decode::<Run>("runs", b"k", &again).expect("round trip"),
            run
        );
    }
});
