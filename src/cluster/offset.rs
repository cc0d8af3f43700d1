//! This node's clock against the database's (HA.md "Time"), NTP-style. Pure.
//!
//! A probe reads the node's wall clock, asks the database for `clock_timestamp()`, and reads
//! the wall clock again. The database's reading lies somewhere in the round trip; taking its
//! middle bounds the error by half the round trip, so of several probes the one with the
//! shortest round trip is believed. Above `[cluster] max_clock_offset` a node refuses to own
//! shards (its wheel would fire at the wrong database instant).

/// One probe: the node's wall clock before and after, and the database's reading (all ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    pub sent_ms: u64,
    pub db_ms: u64,
    pub received_ms: u64,
}

/// The estimate: database minus node (positive: the node is behind), and its error bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offset {
    pub offset_ms: i64,
    pub error_ms: u64,
}

/// The estimate from the probe with the shortest round trip (`None` without a sane probe:
/// one whose answer came before its send is a wall-clock jump, not a measurement).
pub fn estimate(probes: &[Probe]) -> Option<Offset> {
    let best = probes
        .iter()
        .filter(|p| p.received_ms >= p.sent_ms)
        .min_by_key(|p| p.received_ms - p.sent_ms)?;
    let rtt = best.received_ms - best.sent_ms;
    let mid = best.sent_ms + rtt / 2;
    let offset_ms = i64::try_from(best.db_ms).ok()? - i64::try_from(mid).ok()?;
    Some(Offset {
        offset_ms,
        error_ms: rtt.div_ceil(2),
    })
}

/// Whether a node this far off may own shards: only if even the worst case of the estimate
/// is within `max_ms`.
pub fn acceptable(o: Offset, max_ms: u64) -> bool {
    o.offset_ms.unsigned_abs().saturating_add(o.error_ms) <= max_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shortest_round_trip_is_believed() {
        let probes = [
            Probe {
                sent_ms: 1_000,
                db_ms: 1_300,
                received_ms: 1_200,
            },
            Probe {
                sent_ms: 2_000,
                db_ms: 2_105,
                received_ms: 2_010,
            },
        ];
        let o = estimate(&probes).unwrap();
        assert_eq!(
            o,
            Offset {
                offset_ms: 100,
                error_ms: 5
            }
        );
        assert!(acceptable(o, 500));
        assert!(!acceptable(o, 104), "the error bound counts too");
    }

    #[test]
    fn a_node_behind_or_ahead_by_two_seconds_is_refused() {
        let ahead = estimate(&[Probe {
            sent_ms: 10_000,
            db_ms: 8_000,
            received_ms: 10_002,
        }]);
        assert_eq!(ahead.map(|o| o.offset_ms), Some(-2_001));
        assert!(!acceptable(ahead.unwrap(), 500));
    }

    #[test]
    fn a_probe_across_a_wall_jump_is_no_measurement() {
        assert_eq!(
            estimate(&[Probe {
                sent_ms: 5_000,
                db_ms: 5_000,
                received_ms: 4_000
            }]),
            None
        );
        assert_eq!(estimate(&[]), None);
    }
}
