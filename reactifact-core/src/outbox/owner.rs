//! Who this process is as a lease owner, and the take-over of the claims of owners that are
//! provably dead.
//!
//! A restarted service would otherwise find its predecessor's claims in flight, under leases
//! that nobody renews, and wait them out (30 s by default, an hour for a drain configured for
//! long dispatches) before any drain delivers those intents again. Every owner a drain of this
//! crate writes names its process's pid, host, boot, namespaces and start time (see
//! `model/owner.rs` for the format and the rule), so that a drain starting on the same host can
//! prove the predecessor dead by reading `/proc`, and take its claims over at once.
//!
//! The reads are of `/proc` and `/etc/machine-id`, small files: this process's identity once,
//! when its first owner is made; a pid's `stat` per owner judged, when a drain starts.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use crate::model::action::ActionKey;
use crate::model::owner::{self, Death, Owner, Place, Probe};
use crate::store::outbox::{OutboxStore, Scope};
use crate::store::StoreError;

/// This process as a lease owner, and the text its claims carry.
struct This {
    owner: Owner,
    text: Arc<str>,
}

fn this() -> &'static This {
    static THIS: OnceLock<This> = OnceLock::new();
    THIS.get_or_init(|| {
        let pid = std::process::id();
        let started = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let owner = Owner {
            pid,
            started,
            place: read_place(pid),
            drainer: None,
        };
        This {
            text: Arc::from(owner.to_string()),
            owner,
        }
    })
}

/// The lease owner of this process's runtimes (every context of the process): unique per
/// process start, and, where the process can tell, naming where it runs (see
/// `model/owner.rs`).
pub(crate) fn process_owner() -> Arc<str> {
    this().text.clone()
}

/// The lease owner of one standalone drainer of this process: the process's, with ` drainer N`.
pub(crate) fn drainer_owner() -> Arc<str> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Arc::from(format!("{} drainer {n}", this().text))
}

/// Where this process runs and the tick it started at, read from `/proc`; `None` if a part
/// cannot be read, or `/proc` is not of this process's pid namespace (its `self` names another
/// pid): then no owner is ever proved dead by this process, and its own owners never will be.
fn read_place(pid: u32) -> Option<(Place, u64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let (own, _, ticks) = owner::parse_stat(&stat)?;
    if own != pid {
        return None;
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let pid_ns = namespace("pid")?;
    let time_ns = match std::fs::symlink_metadata("/proc/self/ns/time") {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0, // a kernel before 5.6
        _ => namespace("time")?,
    };
    let machine = std::fs::read_to_string("/etc/machine-id").ok();
    Some((Place::new(&host, &boot, pid_ns, time_ns, machine.as_deref())?, ticks))
}

/// The inode of this process's namespace of `kind` (`/proc/self/ns/pid` reads `pid:[N]`).
fn namespace(kind: &str) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/self/ns/{kind}")).ok()?;
    link.to_str()?
        .strip_prefix(kind)?
        .strip_prefix(":[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// What `/proc` says of `pid`: its `stat` if readable; gone only if `/proc` has no entry for
/// it and shows every process (no `hidepid`); unknown otherwise.
fn probe(pid: u32) -> Probe {
    if pid == 0 {
        return Probe::Unknown;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(text) => match owner::parse_stat(&text) {
            Some((found, state, start_ticks)) if found == pid => Probe::Running {
                start_ticks,
                zombie: matches!(state, 'Z' | 'X'),
            },
            _ => Probe::Unknown,
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match std::fs::read_to_string("/proc/self/mountinfo") {
            Ok(mounts) if owner::proc_shows_every_pid(&mounts) => Probe::Gone,
            _ => Probe::Unknown,
        },
        // Permission denied, or the process exited while it was read: nothing is proved.
        Err(_) => Probe::Unknown,
    }
}

/// Why `owner` (a [`Lease::owner`](crate::Lease::owner) as a store keeps it) is provably dead,
/// judged by this process; `None` unless proved (another host or boot that is not provably
/// this host rebooted, an owner this build cannot read, a `/proc` that does not answer).
pub(crate) fn provably_dead(owner: &str) -> Option<Death> {
    let owner = Owner::parse(owner)?;
    owner::verdict(&owner, this().owner.place.as_ref().map(|(place, _)| place), probe)
}

/// Takes over at once the claims of every lease owner of `scope` that is provably dead, and
/// returns how many intents it took: each is pending again, due at once, and delivered again
/// with the same idempotency key, as if its lease had expired (one more
/// [`expired_leases`](crate::Delivery::expired_leases), the attempt ended
/// [`Expired`](crate::AttemptOutcome::Expired)); a late outcome of the dead holder is stale.
/// Each owner taken over is logged at warn, with why it is dead and the keys it held.
///
/// An owner is provably dead when it ran on this host and boot, in this process's pid and
/// time namespaces, and its pid is gone, names a process that started at another time, or a
/// zombie; or when it ran on this host (the same host name and machine id, outside any
/// container's pid namespace) in an earlier boot. Nothing else is proved: an owner of another
/// host, one this build cannot read (an older build's, another crate's), one whose pid `/proc`
/// will not show, or a reader that cannot tell where it runs (not Linux, no `/proc`) — their
/// claims wait out their leases, which any drain reclaims once expired.
///
/// [`Drainer::serve`](crate::Drainer::serve) calls it once as it starts, and so does a serving
/// runtime's delivery; a drain of your own can call it the same way. It looks at the owners of
/// `scope` only ([`OutboxStore::lease_owners`]), and takes over everything an owner it proves
/// dead held, in any scope ([`OutboxStore::take_over`]). It reads `/proc` (memory, not disk) on
/// the calling thread.
///
/// # Errors
/// The store's, from listing the owners or taking one over; the owners taken over before the
/// error stay taken over.
pub async fn reclaim_dead_owners(outbox: &dyn OutboxStore, scope: &Scope) -> Result<usize, StoreError> {
    if this().owner.place.is_none() {
        return Ok(0);
    }
    let owners = outbox.lease_owners(scope).await?;
    let mut taken = 0;
    for owner in owners {
        let Some(death) = provably_dead(&owner) else {
            continue;
        };
        let keys = outbox.take_over(&owner, crate::model::time::now()).await?;
        if keys.is_empty() {
            continue; // another drain took them over first
        }
        tracing::warn!(
            store = %outbox.describe(),
            owner = %owner,
            why = %death,
            count = keys.len(),
            keys = %Shown(&keys),
            "took over the claims of a dead lease owner instead of waiting out their leases: \
             they are due again, and are delivered again with the same keys"
        );
        taken += keys.len();
    }
    Ok(taken)
}

/// [`reclaim_dead_owners`] for a drain that starts: a failure is logged at warn (the claims
/// of dead owners then wait out their leases, as before) and counts as nothing taken.
pub(crate) async fn reclaim_dead_owners_or_warn(outbox: &dyn OutboxStore, scope: &Scope) -> usize {
    reclaim_dead_owners(outbox, scope).await.unwrap_or_else(|e| {
        tracing::warn!(
            store = %outbox.describe(),
            error = %e,
            "the claims of dead lease owners could not be taken over; they wait out their leases"
        );
        0
    })
}

/// The first keys of a list, for a log line.
struct Shown<'a>(&'a [ActionKey]);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 16;
        for (i, key) in self.0.iter().take(SHOWN).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{key}")?;
        }
        if self.0.len() > SHOWN {
            write!(f, ", … ({} more)", self.0.len() - SHOWN)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's owner, with `change` applied, as a store would keep it.
    fn me(change: impl FnOnce(&mut Owner)) -> String {
        let mut owner = this().owner.clone();
        change(&mut owner);
        owner.to_string()
    }

    fn linux() -> bool {
        let provable = this().owner.place.is_some();
        if !provable {
            eprintln!("skipped: this process cannot tell where it runs (no /proc?)");
        }
        provable
    }

    #[test]
    fn this_process_names_its_pid_start_and_place_in_its_owners() {
        let text = process_owner();
        assert!(
            text.starts_with(&format!("pid {} started ", std::process::id())),
            "{text}"
        );
        assert_eq!(Owner::parse(&text).as_ref(), Some(&this().owner));
        let drainer = drainer_owner();
        assert!(drainer.starts_with(&format!("{text} drainer ")), "{drainer}");
        assert_eq!(
            Owner::parse(&drainer).map(|o| o.place),
            Some(this().owner.place.clone())
        );
        if cfg!(target_os = "linux") {
            assert!(text.contains(" on ") && text.contains(" ticks "), "{text}");
        }
    }

    #[test]
    fn this_process_and_its_drainers_are_alive() {
        if !linux() {
            return;
        }
        assert_eq!(provably_dead(&process_owner()), None);
        assert_eq!(provably_dead(&drainer_owner()), None);
        // The parent (the test runner) is alive too, whatever its start.
        let parent = std::fs::read_to_string("/proc/self/stat").unwrap();
        let ppid: u32 = parent
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let stat = std::fs::read_to_string(format!("/proc/{ppid}/stat")).unwrap();
        let (_, _, ticks) = owner::parse_stat(&stat).unwrap();
        let owner = me(|o| {
            o.pid = ppid;
            o.place.as_mut().unwrap().1 = ticks;
        });
        assert_eq!(provably_dead(&owner), None, "{owner}");
    }

    #[test]
    fn a_pid_that_is_gone_is_dead() {
        if !linux() {
            return;
        }
        let mut child = std::process::Command::new("true").spawn().expect("spawn `true`");
        let pid = child.id();
        child.wait().unwrap();
        // Reaped: no process has the pid (unless the system gave it out again at once, when
        // it names a process that started later: dead either way).
        let owner = me(|o| o.pid = pid);
        let death = provably_dead(&owner);
        assert!(
            matches!(death, Some(Death::Gone | Death::PidReused)),
            "{owner}: {death:?}"
        );
    }

    #[test]
    fn a_pid_that_names_a_process_started_at_another_tick_is_dead() {
        if !linux() {
            return;
        }
        // This very pid, as if it had belonged to a process that started a tick earlier.
        let owner = me(|o| o.place.as_mut().unwrap().1 -= 1);
        assert_eq!(provably_dead(&owner), Some(Death::PidReused), "{owner}");
    }

    #[test]
    fn a_process_that_exited_and_waits_to_be_reaped_is_dead() {
        if !linux() {
            return;
        }
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("spawn `sleep`");
        let pid = child.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let (_, _, ticks) = owner::parse_stat(&stat).unwrap();
        let owner = me(|o| {
            o.pid = pid;
            o.place.as_mut().unwrap().1 = ticks;
        });
        assert_eq!(provably_dead(&owner), None, "a running child: {owner}");
        child.kill().unwrap();
        // Killed, not reaped yet: a zombie, once the kill has landed (polled, bounded).
        let mut death = None;
        for _ in 0..10_000 {
            death = provably_dead(&owner);
            if death.is_some() {
                break;
            }
            std::thread::yield_now();
        }
        child.wait().unwrap();
        assert_eq!(death, Some(Death::Zombie), "{owner}");
    }

    #[test]
    fn another_host_a_container_and_garbage_are_never_dead() {
        if !linux() {
            return;
        }
        let gone = {
            let mut child = std::process::Command::new("true").spawn().expect("spawn `true`");
            let pid = child.id();
            child.wait().unwrap();
            pid
        };
        // A dead pid, but on another host, in another pid namespace, or another boot of a
        // host that cannot be told apart from another machine.
        let elsewhere = [
            me(|o| {
                o.pid = gone;
                o.place.as_mut().unwrap().0.host.push_str("-other");
            }),
            me(|o| {
                o.pid = gone;
                o.place.as_mut().unwrap().0.pid_ns += 1;
            }),
            me(|o| {
                o.pid = gone;
                let place = &mut o.place.as_mut().unwrap().0;
                place.boot = "0123456789abcdef".into();
                place.machine = Some("fedcba9876543210".into());
            }),
        ];
        for owner in elsewhere {
            assert_eq!(provably_dead(&owner), None, "{owner}");
        }
        for owner in [
            String::new(),
            "drainer-1".to_owned(),
            "a drain that died".to_owned(),
            format!("pid {gone} started 1"),
            format!("pid {gone} started 1 drainer 1"),
            me(|o| o.pid = gone).replace(" ticks ", " tocks "),
            format!("{} and more", me(|o| o.pid = gone)),
        ] {
            assert_eq!(provably_dead(&owner), None, "{owner:?}");
        }
        // The same host rebooted (same name and machine id, outside containers): dead.
        let place = &this().owner.place.as_ref().unwrap().0;
        if place.machine.is_some() && place.pid_ns == owner::INIT_PID_NS {
            let rebooted = me(|o| o.place.as_mut().unwrap().0.boot = "0123456789abcdef".into());
            assert_eq!(provably_dead(&rebooted), Some(Death::Rebooted), "{rebooted}");
        }
    }

    #[tokio::test]
    async fn a_drain_that_starts_takes_over_the_provably_dead_owners_of_its_scope_only() {
        use crate::model::delivery::DeliveryStatus;
        use crate::store::outbox::ClaimRequest;
        if !linux() {
            return;
        }
        let outbox = crate::store::memory::MemoryOutbox::new();
        let keys = [("k1", "x"), ("k2", "x"), ("k3", "x"), ("k4", "x")];
        let now = crate::model::time::now();
        outbox.register(crate::model::delivery::test_intents("s", 1, &keys).into_iter(), now);
        let gone = {
            let mut child = std::process::Command::new("true").spawn().expect("spawn `true`");
            let pid = child.id();
            child.wait().unwrap();
            pid
        };
        let dead: Arc<str> = me(|o| o.pid = gone).into();
        let elsewhere: Arc<str> = me(|o| {
            o.pid = gone;
            o.place.as_mut().unwrap().0.host.push_str("-other");
        })
        .into();
        let live = drainer_owner();
        let hour = std::time::Duration::from_secs(3600);
        for owner in [&dead, &elsewhere, &live] {
            let claimed = outbox
                .claim(ClaimRequest {
                    scope: &Scope::all(),
                    limit: 1,
                    owner,
                    lease: hour,
                    now,
                    policy: crate::store::ClaimPolicy::none(),
                })
                .await
                .unwrap();
            assert_eq!(claimed.claims.len(), 1);
        }
        // Not in the scope: not looked at.
        assert_eq!(reclaim_dead_owners(&*outbox, &Scope::session("t")).await.unwrap(), 0);
        assert_eq!(
            outbox.get("k1").await.unwrap().unwrap().status(),
            DeliveryStatus::InFlight
        );
        // In it: the dead owner's claim only, once.
        assert_eq!(reclaim_dead_owners(&*outbox, &Scope::session("s")).await.unwrap(), 1);
        assert_eq!(reclaim_dead_owners_or_warn(&*outbox, &Scope::all()).await, 0);
        let k1 = outbox.get("k1").await.unwrap().unwrap();
        assert_eq!((k1.status(), k1.expired_leases()), (DeliveryStatus::Pending, 1));
        assert!(
            k1.last_error().unwrap_or_default().contains(&*dead),
            "{:?}",
            k1.last_error()
        );
        for key in ["k2", "k3"] {
            let d = outbox.get(key).await.unwrap().unwrap();
            assert_eq!(d.status(), DeliveryStatus::InFlight, "{key}");
        }
    }

    #[test]
    fn the_log_shows_the_first_keys_only() {
        let keys: Vec<ActionKey> = (0..20).map(|i| ActionKey::from(format!("k{i}").as_str())).collect();
        assert_eq!(Shown(&keys[..2]).to_string(), "k0, k1");
        let shown = Shown(&keys).to_string();
        assert!(
            shown.starts_with("k0, k1, ") && shown.ends_with("k15, … (4 more)"),
            "{shown}"
        );
    }
}
