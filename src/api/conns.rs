//! The cap on HTTP connections: who is served, who waits, who gives way, and how many event
//! streams a client may hold.
//!
//! Every connection takes a file descriptor; without a cap a client opening idle connections
//! (no token needed to open a TCP connection) would use up the process's descriptors and then
//! webhook sends and the store would fail for want of one. So at most `max` connections are
//! served at once: `max - RESERVE` "regular" slots and [`RESERVE`] for the overflow (the
//! descriptor budget is `max` either way; a cap of [`RESERVE`] or less keeps one regular slot
//! and holds the rest, `max - 1`, in reserve).
//!
//! **No request is dropped unanswered.** A connection whose request was written is never
//! closed without an answer:
//! - When the regular slots are full, the connection that has been *quiet* longest gives way,
//!   but only if it is quiet for [`EVICT_IDLE_MIN`], no request is being handled on it (an
//!   export counts until its last chunk is handed over, or until it gives up on a client that
//!   takes nothing, `export::STALL_MAX`), it does not stream events, hyper is
//!   not inside a read of it, and its socket holds no unread byte (`FIONREAD`): a request that
//!   arrived but that hyper has not read yet keeps its connection. An answer the client has
//!   not read (a write found the socket's buffer full) keeps it for [`STALLED_EVICT_MIN`].
//! - *Quiet* is either of two things. Silent: no byte read or written (idle after a completed
//!   request, or never sent one). Or a head left incomplete: the client began a request head
//!   (bytes read while no request of the connection is in the service) and hyper has read all
//!   of it there is and waits for the rest; the head counts from its first byte, whatever the
//!   client trickles since (a slowloris sending a header byte every 500 ms is never silent,
//!   and hyper would hold it until `header_read_timeout`, 30 s). A real client sends its head
//!   in one go; a request body comes after the head, when the service has the request (busy),
//!   and stays protected. A request is the complete head: once hyper read it (its last read
//!   returned bytes, [`WAITING`] clear) the connection stays until the service marks it busy.
//! - Otherwise the newcomer takes a reserve slot: there `/healthz` is answered at once (so a
//!   monitor reaches herald whatever the API's connections do), and any other request waits
//!   up to [`PROMOTE_WAIT`] for a regular slot, then gets 503 with `Retry-After`.
//! - With the reserve full too, herald stops accepting: new clients wait in the kernel's
//!   listen backlog (`server::LISTEN_BACKLOG`) until a slot frees. They are not closed.
//!
//! **A request outlives its connection** when its client hangs up during a request that changes
//! something (`api::finish`: it runs to its end). Its slot stays taken until it ends, so such
//! requests count against the cap like any other and cannot pile up past it.
//!
//! **Event streams** (`GET /v1/events`) are never evicted (a dashboard keeps one open), so they
//! are capped: at most a quarter of `max` at once, and a quarter of that per client address.
//! A stream over either cap gets 503; streams therefore never fill the table. A stream whose
//! client takes nothing while a frame waits closes its own connection ([`SlotHandle::close`],
//! `events::STALL_MAX`), so clients that stopped reading do not hold the cap for good.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

use super::problem::Problem;

/// How long a connection must be silent before it may be closed to make room.
pub const EVICT_IDLE_MIN: Duration = Duration::from_secs(1);
/// Connections served beyond the cap: `/healthz`, and 503 answers for the rest.
pub const RESERVE: usize = 4;
/// How long a request on a reserve connection waits for a regular slot before its 503.
pub const PROMOTE_WAIT: Duration = Duration::from_secs(2);
/// How often a waiter looks again (a connection turns evictable with time, not with an event).
const RECHECK: Duration = Duration::from_millis(50);
/// At most one warning per this long about the cap; the ones in between are counted in it.
const WARN_EVERY: Duration = Duration::from_secs(10);
/// `Retry-After` of a 503 for an event stream over its cap.
const STREAM_RETRY_AFTER_S: u32 = 5;

/// What happened to the connections that arrived (exported in `/metrics`).
#[derive(Debug, Default)]
pub struct ConnStats {
    /// Connections served (regular or reserve slot).
    pub accepted: AtomicU64,
    /// Silent connections closed to make room for a new one.
    pub evicted: AtomicU64,
    /// Connections that found every regular slot taken and none evictable: served from the
    /// reserve or left waiting in the listen backlog. None of them is closed unanswered.
    pub refused: AtomicU64,
    /// Requests answered 503 because no regular slot freed within [`PROMOTE_WAIT`].
    pub shed: AtomicU64,
    /// Event streams answered 503 (over the total or the per-address cap).
    pub streams_refused: AtomicU64,
}

/// What a connection's socket is doing, kept by [`Tracked`]: the last instant it read or
/// wrote a byte, when the request head it is receiving began, and whether it is inside a
/// read, waits for more of a head or holds an answer the client has not taken.
#[derive(Debug, Default)]
pub struct Activity {
    /// In ms since [`Conns`]' epoch.
    last: AtomicU64,
    /// When the current request head began (ms since the epoch, at least 1): the first byte
    /// read while no request of the connection is in the service. [`NO_HEAD`] before one,
    /// [`IN_SERVICE`] from the service's [`SlotHandle::busy`] to the [`Busy`]'s end.
    head: AtomicU64,
    /// [`READING`], [`WRITE_STALLED`] and [`WAITING`] bits.
    io: AtomicU8,
}

/// [`Activity::head`]: no byte of a next request read yet.
const NO_HEAD: u64 = 0;
/// [`Activity::head`]: the service has the connection's request.
const IN_SERVICE: u64 = u64::MAX;

/// hyper is inside a read of the socket. Set before the read, so a request read between a
/// would-be eviction's look at the activity and its look at the socket's unread bytes is
/// seen by its second look at the activity (`evict_one`).
const READING: u8 = 1;
/// A write found the socket's buffer full: part of an answer waits for the client to read.
/// Such a connection is not quiet until [`STALLED_EVICT_MIN`] (from its last byte, or from
/// the start of a head it leaves incomplete), so that is when it may give way.
const WRITE_STALLED: u8 = 2;
/// hyper's last read of the socket found it empty: it has parsed whatever it read before, so a
/// head it holds is incomplete (it reads no more once a head is whole, and calls the service).
/// Cleared by a read that returns bytes: until hyper looks for more, those may be the end of a
/// head on its way to the service, and the head rule (module docs) does not apply.
const WAITING: u8 = 4;

/// How long a client must leave an answer unread before its connection may be closed to make
/// room (only when room is needed, and never while a request on it is busy): a slow consumer
/// is not cut. An export is busy until its last chunk is handed over; to a client that takes
/// nothing it gives up after `export::STALL_MAX`, and its connection is then such an answer.
pub const STALLED_EVICT_MIN: Duration = Duration::from_secs(30);

impl Activity {
    fn new(now_ms: u64) -> Activity {
        Activity {
            last: AtomicU64::new(now_ms),
            head: AtomicU64::new(NO_HEAD),
            io: AtomicU8::new(0),
        }
    }

    /// Quiet for long enough to give way (module docs), as of `now` (ms since the epoch):
    /// since when it is quiet, and the `last` stamp it was judged with.
    fn may_give_way(&self, now: u64) -> Option<(u64, u64)> {
        // `io` first: a read that ends after this load changes `last` or `io`, which the
        // second look in `evict_one` sees.
        let io = self.io.load(Ordering::SeqCst);
        if io & READING != 0 {
            return None;
        }
        let last = self.last.load(Ordering::SeqCst);
        let head = self.head.load(Ordering::SeqCst);
        let incomplete = io & WAITING != 0 && head != NO_HEAD && head != IN_SERVICE;
        let since = if incomplete { head.min(last) } else { last };
        let min = if io & WRITE_STALLED != 0 {
            STALLED_EVICT_MIN
        } else {
            EVICT_IDLE_MIN
        };
        (now.saturating_sub(since) >= min.as_millis() as u64).then_some((since, last))
    }
}

struct Entry {
    busy: u32,
    /// The client's address while it streams events (counted against the stream caps).
    stream: Option<IpAddr>,
    reserve: bool,
    peer: IpAddr,
    /// The socket, for `FIONREAD`. Valid while the entry is in the table: the connection's
    /// task drops its slot before its stream.
    fd: RawFd,
    activity: Arc<Activity>,
    close: Arc<Notify>,
    /// The connection ended while a request of it still ran: the entry leaves the table with
    /// that request's end.
    closed: bool,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    entries: HashMap<u64, Entry>,
    regular: usize,
    reserve: usize,
    streams: usize,
    streams_by_peer: HashMap<IpAddr, usize>,
}

impl Table {
    /// Takes connection `id` out of the table and its counts; its entry if it was there.
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = self.entries.remove(&id)?;
        if e.reserve {
            self.reserve -= 1;
        } else {
            self.regular -= 1;
        }
        if let Some(peer) = e.stream {
            self.streams -= 1;
            if let Some(n) = self.streams_by_peer.get_mut(&peer) {
                *n -= 1;
                if *n == 0 {
                    self.streams_by_peer.remove(&peer);
                }
            }
        }
        Some(e)
    }
}

/// Lets a repeated warning through at most once per [`WARN_EVERY`], counting the ones held
/// back in between (the cap's refusals here, failed accepts in `api::serve`).
#[derive(Default)]
pub(super) struct WarnGate {
    last: Option<Instant>,
    suppressed: u64,
}

impl WarnGate {
    /// Whether a warning at `now` is logged: `Some(n)` with the `n` held back since the last
    /// one logged, `None` (counted) within [`WARN_EVERY`] of it.
    pub(super) fn pass(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|l| now.saturating_duration_since(l) < WARN_EVERY)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

pub struct Conns {
    /// `connections_max`: regular slots plus the reserve.
    max: usize,
    /// Regular slots.
    regular_max: usize,
    /// Reserve slots: `max - regular_max`, [`RESERVE`] unless the cap is smaller.
    reserve_max: usize,
    streams_max: usize,
    streams_per_client: usize,
    epoch: Instant,
    table: Mutex<Table>,
    /// Notified when a slot is freed.
    freed: Notify,
    warn: Mutex<WarnGate>,
    pub stats: ConnStats,
}

/// A served connection's slot; freed when dropped.
pub struct Slot {
    conns: Arc<Conns>,
    id: u64,
    /// The connection's activity, updated by [`Tracked`].
    pub activity: Arc<Activity>,
    /// Notified when the connection is evicted: its task then drops it (closing the socket).
    pub close: Arc<Notify>,
}

/// Marks the connection busy while a request is handled.
pub struct Busy {
    conns: Arc<Conns>,
    id: u64,
}

/// Event streams allowed at once for `max` connections: a quarter of them, and a quarter of
/// that per client address (at least one each).
pub fn stream_caps(max: usize) -> (usize, usize) {
    let total = (max / 4).max(1);
    (total, (total / 4).max(1))
}

/// Bytes the kernel holds unread on `fd`; `None` if it cannot say.
fn unread(fd: RawFd) -> Option<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int; `fd` is open (see `Entry::fd`).
    let r = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
    (r == 0).then_some(n.max(0) as usize)
}

impl Conns {
    pub fn new(max: usize) -> Arc<Conns> {
        let max = max.max(1);
        let (streams_max, streams_per_client) = stream_caps(max);
        // A cap so small that the reserve would take most of it keeps one regular slot, and
        // the reserve gets what is left: together never more than `max` (the budget).
        let regular_max = max.saturating_sub(RESERVE).max(1);
        Arc::new(Conns {
            max,
            regular_max,
            reserve_max: max - regular_max,
            streams_max,
            streams_per_client,
            // Far enough back that "silent since 0" (tests) is older than either bound.
            epoch: Instant::now()
                .checked_sub(STALLED_EVICT_MIN * 2)
                .unwrap_or_else(Instant::now),
            table: Mutex::new(Table::default()),
            freed: Notify::new(),
            warn: Mutex::new(WarnGate::default()),
            stats: ConnStats::default(),
        })
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// `(total, per client address)` caps on event streams.
    pub fn stream_caps(&self) -> (usize, usize) {
        (self.streams_max, self.streams_per_client)
    }

    /// Connections being served now (regular and reserve).
    pub fn open(&self) -> usize {
        self.table.lock().entries.len()
    }

    /// Event streams open now.
    pub fn streams(&self) -> usize {
        self.table.lock().streams
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Closes the connection silent longest, if one may give way (module docs). Returns
    /// whether a slot was freed: a regular one, or with `reserve` a reserve one (a monitor's
    /// keep-alive connection after its `/healthz`).
    fn evict_one(&self, t: &mut Table, reserve: bool) -> bool {
        let now = self.now_ms();
        // `busy` changes only under the table's lock, which this holds: it stays 0 here.
        let mut candidates: Vec<(u64, u64, u64)> = t
            .entries
            .iter()
            .filter(|(_, e)| e.reserve == reserve && e.busy == 0 && e.stream.is_none())
            .filter_map(|(id, e)| {
                let (since, last) = e.activity.may_give_way(now)?;
                Some((since, last, *id))
            })
            .collect();
        candidates.sort_unstable();
        for (_, last, id) in candidates {
            let Some(e) = t.entries.get(&id) else {
                continue;
            };
            // A request that reached the socket but not hyper yet: this one stays.
            if unread(e.fd) != Some(0) {
                continue;
            }
            // And one hyper read in the meantime (on another worker; its service has not
            // marked the connection busy yet): its read is under way, or it stamped `last`
            // and cleared `WAITING` by now.
            if e.activity.may_give_way(now).map(|(_, l)| l) != Some(last) {
                continue;
            }
            if let Some(e) = t.remove(id) {
                // `notify_one` keeps a permit if the task is not waiting yet: never lost.
                e.close.notify_one();
                self.stats.evicted.fetch_add(1, Ordering::Relaxed);
                return true;
            }
        }
        false
    }

    /// A slot for a connection just accepted from `peer` on `fd`: a regular one (free, or
    /// made by closing a silent connection), else a reserve one; `None` when both are full
    /// (the caller holds the connection and waits with [`Conns::wait_freed`]). `first` says
    /// whether this is the connection's first try (it is counted and logged once).
    pub fn admit(self: &Arc<Self>, peer: IpAddr, fd: RawFd, first: bool) -> Option<Slot> {
        let mut t = self.table.lock();
        let reserve = if t.regular < self.regular_max || self.evict_one(&mut t, false) {
            false
        } else if t.reserve < self.reserve_max || self.evict_one(&mut t, true) {
            true
        } else {
            drop(t);
            if first {
                self.refused(peer, "new clients wait in the listen backlog");
            }
            return None;
        };
        t.next_id += 1;
        let id = t.next_id;
        let close = Arc::new(Notify::new());
        let activity = Arc::new(Activity::new(self.now_ms()));
        t.entries.insert(
            id,
            Entry {
                busy: 0,
                stream: None,
                reserve,
                peer,
                fd,
                activity: activity.clone(),
                close: close.clone(),
                closed: false,
            },
        );
        if reserve {
            t.reserve += 1;
        } else {
            t.regular += 1;
        }
        drop(t);
        if reserve && first {
            self.refused(
                peer,
                "served from the reserve: /healthz, or 503 if no slot frees",
            );
        }
        self.stats.accepted.fetch_add(1, Ordering::Relaxed);
        Some(Slot {
            conns: self.clone(),
            id,
            activity,
            close,
        })
    }

    /// Counts a refusal and warns, at most once per [`WARN_EVERY`].
    fn refused(&self, peer: IpAddr, what: &str) {
        self.stats.refused.fetch_add(1, Ordering::Relaxed);
        let Some(suppressed) = self.warn.lock().pass(Instant::now()) else {
            return;
        };
        tracing::warn!(%peer, max = self.max, suppressed,
            "connection cap reached: every connection is busy or recently active; {what} (suppressed: like warnings since the last one)");
    }

    /// Waits until a slot may be free: one was freed, or [`RECHECK`] passed (a connection
    /// turns evictable by staying silent, which no event announces).
    pub async fn wait_freed(&self) {
        let _ = tokio::time::timeout(RECHECK, self.freed.notified()).await;
    }
}

impl Slot {
    /// A handle the request handler can use to mark the connection.
    pub fn handle(&self) -> SlotHandle {
        SlotHandle {
            conns: self.conns.clone(),
            id: self.id,
        }
    }
}

/// What a request handler holds of its connection's slot.
#[derive(Clone)]
pub struct SlotHandle {
    conns: Arc<Conns>,
    id: u64,
}

impl SlotHandle {
    /// Marks the connection busy while its request is in the service: never evicted, and the
    /// head it received is complete (bytes read from now on are no next head's).
    pub fn busy(&self) -> Busy {
        if let Some(e) = self.conns.table.lock().entries.get_mut(&self.id) {
            e.busy += 1;
            e.activity.head.store(IN_SERVICE, Ordering::SeqCst);
        }
        Busy {
            conns: self.conns.clone(),
            id: self.id,
        }
    }

    /// Lets the request on this connection be handled: at once on a regular slot or for
    /// `/healthz`; on a reserve slot it waits up to [`PROMOTE_WAIT`] for a regular one, then
    /// it is a 503 with `Retry-After` (and the connection closes after the answer).
    pub async fn admit_request(&self, path: &str) -> Result<(), Problem> {
        if path.trim_end_matches('/') == "/healthz" {
            return Ok(());
        }
        let end = tokio::time::Instant::now() + PROMOTE_WAIT;
        loop {
            if self.promote() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= end {
                break;
            }
            self.conns.wait_freed().await;
        }
        self.conns.stats.shed.fetch_add(1, Ordering::Relaxed);
        let mut p = Problem::unavailable(format!(
            "every one of the {} connection slots is busy; try again shortly",
            self.conns.max
        ))
        .kind("connections-busy", "Connections busy");
        p.close = true;
        Err(p)
    }

    /// Moves a reserve connection to a regular slot if one is free or can be made; true if it
    /// is (or already was) regular.
    fn promote(&self) -> bool {
        let conns = &self.conns;
        let mut t = conns.table.lock();
        match t.entries.get(&self.id) {
            Some(e) if e.reserve => {}
            _ => return true,
        }
        if t.regular >= conns.regular_max && !conns.evict_one(&mut t, false) {
            return false;
        }
        t.reserve -= 1;
        t.regular += 1;
        if let Some(e) = t.entries.get_mut(&self.id) {
            e.reserve = false;
        }
        true
    }

    /// Closes the connection now, as an eviction does (its task drops it, and with it the slot
    /// and the stream it counts as): an event stream whose client stopped reading
    /// (`events.rs`). Nothing if it is gone already.
    pub fn close(&self) {
        if let Some(e) = self.conns.table.lock().entries.get(&self.id) {
            // `notify_one` keeps a permit if the task is not waiting yet: never lost.
            e.close.notify_one();
        }
    }

    /// Counts this connection as an event stream (never evicted from now on), or a 503 when
    /// streams are at their total cap or at the cap for this client's address.
    pub fn start_stream(&self) -> Result<(), Problem> {
        let conns = &self.conns;
        let mut t = conns.table.lock();
        let Some(peer) = t.entries.get(&self.id).map(|e| e.peer) else {
            return Ok(());
        };
        let of_peer = t.streams_by_peer.get(&peer).copied().unwrap_or(0);
        let over = if t.streams >= conns.streams_max {
            Some(format!(
                "{} event streams are open, the most herald serves at once; try again later",
                t.streams
            ))
        } else if of_peer >= conns.streams_per_client {
            Some(format!(
                "this address has {of_peer} event streams open, the most for one client; close one or try again later"
            ))
        } else {
            None
        };
        if let Some(detail) = over {
            drop(t);
            conns.stats.streams_refused.fetch_add(1, Ordering::Relaxed);
            let mut p =
                Problem::unavailable(detail).kind("too-many-streams", "Too many event streams");
            p.retry_after_s = Some(STREAM_RETRY_AFTER_S);
            return Err(p);
        }
        t.streams += 1;
        *t.streams_by_peer.entry(peer).or_insert(0) += 1;
        if let Some(e) = t.entries.get_mut(&self.id) {
            e.stream = Some(peer);
        }
        Ok(())
    }
}

impl Drop for Busy {
    /// The last request of a connection already closed frees its slot.
    fn drop(&mut self) {
        let mut t = self.conns.table.lock();
        let Some(e) = t.entries.get_mut(&self.id) else {
            return;
        };
        e.busy = e.busy.saturating_sub(1);
        if e.busy == 0 {
            // The next bytes read begin the next request's head.
            e.activity.head.store(NO_HEAD, Ordering::SeqCst);
        }
        if e.busy == 0 && e.closed {
            t.remove(self.id);
            drop(t);
            self.conns.freed.notify_waiters();
        }
    }
}

impl Drop for Slot {
    /// Frees the slot, unless a request of the connection still runs (its client hung up
    /// and the request runs to its end, `api::finish`): then the slot stays taken until that
    /// request's [`Busy`] ends, so requests whose clients left count against the cap too and
    /// cannot pile up past it.
    fn drop(&mut self) {
        let mut t = self.conns.table.lock();
        if let Some(e) = t.entries.get_mut(&self.id) {
            if e.busy > 0 {
                // The socket closes after this: its descriptor may be reused at once, so
                // nothing may read it from now on (a busy entry is never a candidate to
                // evict, and it leaves the table when its last request ends).
                e.closed = true;
                e.fd = -1;
                return;
            }
        }
        t.remove(self.id);
        drop(t);
        self.conns.freed.notify_waiters();
    }
}

/// A socket that stamps its connection's [`Activity`] on every byte read or written.
pub struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
    conns: Arc<Conns>,
}

impl<S> Tracked<S> {
    pub fn new(inner: S, slot: &Slot) -> Tracked<S> {
        Tracked {
            inner,
            activity: slot.activity.clone(),
            conns: slot.conns.clone(),
        }
    }

    fn touch(&self) {
        self.activity
            .last
            .store(self.conns.now_ms(), Ordering::SeqCst);
    }

    /// After a read that returned bytes: stamps the activity, and the head's start if these
    /// are the first bytes of one (no request in the service), then ends the read
    /// ([`READING`]) and the wait for more ([`WAITING`]) in one step.
    fn read_some(&self) {
        let now = self.conns.now_ms();
        // Fails (and so leaves it) when a head is under way already or the service has one.
        let _ = self.activity.head.compare_exchange(
            NO_HEAD,
            now.max(1),
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        self.activity.last.store(now, Ordering::SeqCst);
        self.activity
            .io
            .fetch_and(!(READING | WAITING), Ordering::SeqCst);
    }

    /// After a write: progress stamps the activity and ends a stall; a full buffer starts one.
    fn wrote(&self, r: &Poll<std::io::Result<usize>>) {
        match r {
            Poll::Ready(Ok(n)) if *n > 0 => {
                self.touch();
                // Read first: most writes end no stall, and a load is cheaper than a swap.
                if self.activity.io.load(Ordering::Relaxed) & WRITE_STALLED != 0 {
                    self.activity.io.fetch_and(!WRITE_STALLED, Ordering::SeqCst);
                }
            }
            Poll::Pending => {
                self.activity.io.fetch_or(WRITE_STALLED, Ordering::SeqCst);
            }
            _ => {}
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        self.activity.io.fetch_or(READING, Ordering::SeqCst);
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        match r {
            Poll::Ready(Ok(())) if buf.filled().len() > before => self.read_some(),
            Poll::Pending => {
                // Set before `READING` is cleared: no look sees a finished read without it.
                self.activity.io.fetch_or(WAITING, Ordering::SeqCst);
                self.activity.io.fetch_and(!READING, Ordering::SeqCst);
            }
            _ => {
                self.activity
                    .io
                    .fetch_and(!(READING | WAITING), Ordering::SeqCst);
            }
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        self.wrote(&r);
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A test knob's duration: `env` in milliseconds when set, else `default` (unset, zero or
/// unreadable). Test knobs, not configuration (the export's and the event streams' stall bounds).
pub(super) fn knob_ms(env: &str, default: Duration) -> Duration {
    std::env::var(env)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map_or(default, Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::StatusCode;

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn a_warning_goes_once_per_period_with_the_count_held_back() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut g = WarnGate::default();
        assert_eq!(g.pass(at(0)), Some(0));
        // Out of descriptors, accept fails every 50 ms: held back, counted.
        for ms in (50..10_000).step_by(50) {
            assert_eq!(g.pass(at(ms)), None, "at {ms} ms");
        }
        assert_eq!(g.pass(at(10_000)), Some(199));
        assert_eq!(g.pass(at(10_050)), None);
        // Quiet for a while: the next one goes, with the one held back.
        assert_eq!(g.pass(at(60_000)), Some(1));
        // An instant before the last one (readings out of order) is within the period.
        assert_eq!(g.pass(at(59_000)), None);
    }

    /// A connected socket pair's fds stay open for the test (nothing unread in them).
    fn fd() -> (
        RawFd,
        std::os::unix::net::UnixStream,
        std::os::unix::net::UnixStream,
    ) {
        use std::os::fd::AsRawFd;
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        (a.as_raw_fd(), a, b)
    }

    /// Makes the slot look silent for longer than [`EVICT_IDLE_MIN`].
    fn age(s: &Slot) {
        s.activity.last.store(0, Ordering::SeqCst);
    }

    #[test]
    fn only_a_silent_idle_connection_gives_way_and_a_full_table_uses_the_reserve() {
        let (f, _a, _b) = fd();
        let c = Conns::new(RESERVE + 2);
        let a = c.admit(LOCAL, f, true).expect("room");
        let b = c.admit(LOCAL, f, true).expect("room");
        // Both just active: neither may be closed, the newcomer goes to the reserve.
        let r = c.admit(LOCAL, f, true).expect("reserve");
        assert!(c.table.lock().entries[&r.id].reserve);
        assert_eq!(c.stats.evicted.load(Ordering::Relaxed), 0);
        assert_eq!(c.stats.refused.load(Ordering::Relaxed), 1);
        // `a` silent long enough: it makes room; `b` is busy, so it never does.
        age(&a);
        age(&b);
        let _busy_b = b.handle().busy();
        let third = c.admit(LOCAL, f, true).expect("evicts the silent one");
        assert!(!c.table.lock().entries[&third.id].reserve);
        assert_eq!(c.stats.evicted.load(Ordering::Relaxed), 1);
        // `a` was told to close; its drop later must not free someone else's slot.
        drop(a);
        assert_eq!(c.table.lock().regular, 2);
        // Fill the reserve: then nobody is admitted (the caller waits, the backlog holds).
        let _more: Vec<_> = (1..RESERVE)
            .map(|_| c.admit(LOCAL, f, true).expect("reserve"))
            .collect();
        assert!(c.admit(LOCAL, f, true).is_none());
        drop(r);
        assert!(c.admit(LOCAL, f, false).is_some(), "a reserve slot freed");
    }

    /// Review finding: a cap under `RESERVE + 1` kept one regular slot and a whole reserve,
    /// serving up to `RESERVE + 1` connections (5 for a cap of 1), past the descriptor budget.
    #[test]
    fn no_cap_serves_more_connections_than_itself() {
        let (f, _a, _b) = fd();
        for max in 1..=RESERVE + 2 {
            let c = Conns::new(max);
            let held: Vec<_> = (0..max)
                .map(|_| c.admit(LOCAL, f, true).expect("room"))
                .collect();
            assert!(
                c.admit(LOCAL, f, true).is_none(),
                "a cap of {max} served one more"
            );
            assert_eq!(c.open(), max);
            let t = c.table.lock();
            assert_eq!(t.regular, max.saturating_sub(RESERVE).max(1), "cap {max}");
            assert!(held.first().is_some_and(|s| !t.entries[&s.id].reserve));
        }
    }

    #[test]
    fn a_request_whose_connection_closed_keeps_its_slot_to_its_end() {
        let (f, _a, _b) = fd();
        let c = Conns::new(RESERVE + 1);
        let a = c.admit(LOCAL, f, true).expect("room");
        let request = a.handle().busy();
        // The client hangs up: the connection's task drops its slot, the request runs on.
        drop(a);
        assert_eq!(c.open(), 1, "the running request still holds the slot");
        let t = c.table.lock();
        assert_eq!(t.regular, 1);
        assert!(t.entries.values().all(|e| e.closed && e.fd == -1));
        drop(t);
        // The only regular slot is taken and the request is not evictable: a newcomer gets
        // the reserve.
        let r = c.admit(LOCAL, f, true).expect("reserve");
        assert!(c.table.lock().entries[&r.id].reserve);
        drop(request);
        assert_eq!(c.open(), 1, "only the newcomer is left");
        assert_eq!(c.table.lock().regular, 0);
        assert!(
            r.handle().promote(),
            "the freed regular slot goes to the newcomer"
        );
    }

    #[test]
    fn a_read_under_way_or_an_answer_left_unread_keeps_a_connection() {
        let (f, _a, _b) = fd();
        let c = Conns::new(RESERVE + 1);
        let a = c.admit(LOCAL, f, true).unwrap();
        age(&a);
        // hyper is inside a read of it: it stays.
        a.activity.io.store(READING, Ordering::SeqCst);
        let r = c.admit(LOCAL, f, true).expect("reserve");
        assert!(
            c.table.lock().entries[&r.id].reserve,
            "not evicted while read"
        );
        drop(r);
        // Its answer waits for the client: it stays for STALLED_EVICT_MIN, then gives way.
        a.activity.io.store(WRITE_STALLED, Ordering::SeqCst);
        let two_s_ago = c.now_ms() - 2 * EVICT_IDLE_MIN.as_millis() as u64;
        a.activity.last.store(two_s_ago, Ordering::SeqCst);
        let r = c.admit(LOCAL, f, true).expect("reserve");
        assert!(
            c.table.lock().entries[&r.id].reserve,
            "not evicted: answer unread 2 s"
        );
        drop(r);
        age(&a);
        let r = c.admit(LOCAL, f, true).expect("a regular slot");
        assert!(
            !c.table.lock().entries[&r.id].reserve,
            "evicted: answer unread 30 s"
        );
        assert_eq!(c.stats.evicted.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_head_left_incomplete_gives_way_whatever_it_trickles() {
        let (f, _a, _b) = fd();
        let c = Conns::new(RESERVE + 1);
        let a = c.admit(LOCAL, f, true).unwrap();
        let now = c.now_ms();
        let two_s_ago = now - 2 * EVICT_IDLE_MIN.as_millis() as u64;
        // A head begun 2 s ago whose latest byte was read just now: not silent.
        a.activity.head.store(two_s_ago, Ordering::SeqCst);
        a.activity.last.store(now, Ordering::SeqCst);
        // hyper read bytes it has not looked for more after (the end of the head, maybe, on
        // its way to the service): it stays.
        let in_reserve = |r: &Slot| c.table.lock().entries[&r.id].reserve;
        let r = c.admit(LOCAL, f, true).expect("reserve");
        assert!(in_reserve(&r), "not evicted: hyper may hold a whole head");
        drop(r);
        // The service has the request: it stays, and its bytes begin no head.
        a.activity.io.store(WAITING, Ordering::SeqCst);
        let busy = a.handle().busy();
        assert_eq!(a.activity.head.load(Ordering::SeqCst), IN_SERVICE);
        let r = c.admit(LOCAL, f, true).expect("reserve");
        assert!(in_reserve(&r), "not evicted: a request in the service");
        drop(r);
        // Its end: the next bytes begin the next head; none yet, and not silent: it stays.
        drop(busy);
        assert_eq!(a.activity.head.load(Ordering::SeqCst), NO_HEAD);
        let r = c.admit(LOCAL, f, true).expect("reserve");
        assert!(in_reserve(&r), "not evicted: active just now");
        drop(r);
        // A head begun 2 s ago, hyper waiting for the rest of it: it gives way.
        a.activity.head.store(two_s_ago, Ordering::SeqCst);
        let r = c.admit(LOCAL, f, true).expect("a regular slot");
        assert!(!in_reserve(&r), "evicted: a head incomplete for 2 s");
        assert_eq!(c.stats.evicted.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn tracked_reads_mark_the_head_and_the_wait_for_more() {
        use std::future::Future;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (f, _a, _b) = fd();
        let c = Conns::new(RESERVE + 1);
        let slot = c.admit(LOCAL, f, true).unwrap();
        let (client, server) = tokio::io::duplex(64);
        let (mut client, mut t) = (client, Tracked::new(server, &slot));
        let act = &slot.activity;
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let mut buf = [0u8; 64];
        assert!(t.read(&mut buf).await.unwrap() > 0);
        let began = act.head.load(Ordering::SeqCst);
        assert!(began != NO_HEAD && began != IN_SERVICE, "the head began");
        assert_eq!(act.io.load(Ordering::SeqCst), 0, "bytes read: no wait");
        // Nothing more in the socket: the read waits, and says so.
        let mut read = std::pin::pin!(t.read(&mut buf));
        let cx = &mut Context::from_waker(std::task::Waker::noop());
        assert!(read.as_mut().poll(cx).is_pending());
        assert_eq!(act.io.load(Ordering::SeqCst), WAITING);
        // A trickled byte moves `last`, not the head's start.
        client.write_all(b"X").await.unwrap();
        assert!(matches!(read.as_mut().poll(cx), Poll::Ready(Ok(1))));
        assert_eq!(act.head.load(Ordering::SeqCst), began);
        assert_eq!(act.io.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn unread_bytes_keep_a_connection() {
        use std::io::Write;
        let (f, _a, mut b) = fd();
        let c = Conns::new(RESERVE + 1);
        let a = c.admit(LOCAL, f, true).unwrap();
        age(&a);
        b.write_all(b"POST /v1/tasks HTTP/1.1\r\n").unwrap();
        let r = c.admit(LOCAL, f, true).expect("reserve");
        assert!(
            c.table.lock().entries[&r.id].reserve,
            "not evicted: a request waits"
        );
        assert_eq!(c.stats.evicted.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_reserve_connection_answers_healthz_and_is_promoted_when_a_slot_frees() {
        let (f, _a, _b) = fd();
        let c = Conns::new(RESERVE + 1);
        let a = c.admit(LOCAL, f, true).unwrap();
        let r = c.admit(LOCAL, f, true).unwrap();
        let h = r.handle();
        assert!(h.admit_request("/healthz").await.is_ok());
        let waiting = tokio::spawn({
            let h = h.clone();
            async move { h.admit_request("/v1/tasks").await.is_ok() }
        });
        drop(a);
        assert!(waiting.await.unwrap(), "promoted once the slot freed");
        assert_eq!(c.table.lock().regular, 1);
        assert_eq!(c.table.lock().reserve, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reserve_connection_with_no_slot_freeing_gets_503_with_retry_after() {
        let (f, _a, _b) = fd();
        let c = Conns::new(RESERVE + 1);
        let a = c.admit(LOCAL, f, true).unwrap();
        let _busy = a.handle().busy();
        let r = c.admit(LOCAL, f, true).unwrap();
        let p = r.handle().admit_request("/v1/tasks").await.unwrap_err();
        assert_eq!(p.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(p.retry_after_s.is_some() && p.close);
        assert_eq!(c.stats.shed.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn streams_are_capped_in_total_and_per_address_and_never_evicted() {
        let (f, _a, _b) = fd();
        let c = Conns::new(16); // 4 streams, 1 per address
        let other = |i: u8| IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, i));
        let first = c.admit(other(1), f, true).unwrap();
        first.handle().start_stream().unwrap();
        let same = c.admit(other(1), f, true).unwrap();
        let p = same.handle().start_stream().unwrap_err();
        assert_eq!(p.status, StatusCode::SERVICE_UNAVAILABLE);
        let rest: Vec<_> = (2..=4)
            .map(|i| {
                let s = c.admit(other(i), f, true).unwrap();
                s.handle().start_stream().unwrap();
                s
            })
            .collect();
        let fifth = c.admit(other(5), f, true).unwrap();
        assert!(fifth.handle().start_stream().is_err(), "total cap");
        assert_eq!(c.streams(), 4);
        assert_eq!(c.stats.streams_refused.load(Ordering::Relaxed), 2);
        // A stream is never the one that gives way, however silent.
        age(&first);
        assert!(!c.evict_one(&mut c.table.lock(), false));
        drop(rest);
        drop(first);
        assert_eq!(c.streams(), 0);
        assert!(fifth.handle().start_stream().is_ok(), "room again");
    }
}
