//! Who holds a lease: the owner a drain writes into each of its claims, read back, and the rule
//! that decides from it whether that owner is provably dead.
//!
//! An owner reads `pid 923 started 1796146740065337846`: the process's id and the wall-clock
//! time (Unix nanoseconds) at which it first named itself. Where the process can tell where it
//! runs (Linux, with `/proc`), the owner goes on with
//! `on HOST boot BOOT ns PIDNS:TIMENS ticks TICKS`: its host name, the first 16 hex digits of
//! the kernel's boot id, the inodes of its pid and time namespaces (`0` for a kernel without
//! time namespaces), and its start time in clock ticks since boot (field 22 of
//! `/proc/self/stat`); then ` machine MACHINE` (the first 16 hex digits of `/etc/machine-id`)
//! when the host has one. A standalone drainer appends ` drainer N`.
//!
//! [`verdict`] is the rule, a pure function of the owner, the reading process's own identity
//! and what `/proc` says of the owner's pid. It says dead only where death is proved:
//!
//! - same host, same boot, same namespaces: the pid is gone, or it now names a process that
//!   started at another tick (the pid was reused), or a zombie;
//! - same host and machine id, both in the initial pid namespace, another boot: the host has
//!   rebooted since, and every process of the old boot is gone.
//!
//! Everything else — another host, an owner without a place (written by an older build, or on
//! another system), a `/proc` that does not answer, a format this build cannot read — proves
//! nothing: the owner's claims wait out their lease.
//!
//! No I/O here: the process's own identity and the reading of `/proc` are `outbox/owner.rs`'s.

use std::fmt;

/// The inode of the initial pid namespace (`PROC_PID_INIT_INO`, the same on every Linux
/// boot): a process that reports it is not in a container's pid namespace.
pub(crate) const INIT_PID_NS: u64 = 0xEFFF_FFFC;

/// Where a process runs: its host, boot and namespaces. Two processes that report the same
/// place see the same processes under the same pids, with start times on the same clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    /// The host name (no whitespace, not empty).
    pub(crate) host: String,
    /// The first 16 hex digits of the kernel's boot id (lowercase, no dashes).
    pub(crate) boot: String,
    /// The inode of the pid namespace.
    pub(crate) pid_ns: u64,
    /// The inode of the time namespace, 0 if the kernel has none.
    pub(crate) time_ns: u64,
    /// The first 16 hex digits of the machine id, if the host has one.
    pub(crate) machine: Option<String>,
}

impl Place {
    /// A place from what the process read of itself; `None` if a part cannot be written into
    /// an owner (an empty host name, or one with whitespace or control characters; a boot id
    /// or machine id without 16 hex digits).
    pub(crate) fn new(host: &str, boot_id: &str, pid_ns: u64, time_ns: u64, machine_id: Option<&str>) -> Option<Place> {
        let host = host.trim();
        if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return None;
        }
        Some(Place {
            host: host.to_owned(),
            boot: hex16(boot_id)?,
            pid_ns,
            time_ns,
            machine: machine_id.and_then(hex16),
        })
    }
}

/// The first 16 hex digits of an id (dashes skipped), lowercase; `None` if it has fewer, or
/// anything but hex digits and dashes.
fn hex16(id: &str) -> Option<String> {
    let id = id.trim();
    if !id.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return None;
    }
    let digits: String = id
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(16)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    (digits.len() == 16).then_some(digits)
}

/// A lease owner, as written into claims ([`fmt::Display`]) and read back ([`Owner::parse`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Owner {
    /// The process id.
    pub(crate) pid: u32,
    /// When the process first named itself, in Unix nanoseconds.
    pub(crate) started: u128,
    /// Where it runs, and when it started there: `None` where it could not tell.
    pub(crate) place: Option<(Place, u64)>,
    /// The standalone drainer of the process, if the owner is one.
    pub(crate) drainer: Option<u64>,
}

impl Owner {
    /// Reads an owner written by [`fmt::Display`]; `None` for anything else (an owner of
    /// another crate's drain, a damaged one), whose death is then never proved.
    pub(crate) fn parse(text: &str) -> Option<Owner> {
        let mut words = text.split(' ');
        let mut next = || words.next();
        if next()? != "pid" {
            return None;
        }
        let pid = number(next()?)?;
        if next()? != "started" {
            return None;
        }
        let started = number(next()?)?;
        let (mut host, mut boot, mut ns, mut ticks, mut machine, mut drainer) = (None, None, None, None, None, None);
        while let Some(word) = next() {
            let value = next()?;
            let slot = match word {
                "on" => &mut host,
                "boot" => &mut boot,
                "ns" => &mut ns,
                "ticks" => &mut ticks,
                "machine" => &mut machine,
                "drainer" => &mut drainer,
                _ => return None,
            };
            if slot.replace(value).is_some() {
                return None;
            }
        }
        let place = match (host, boot, ns, ticks) {
            (None, None, None, None) if machine.is_none() => None,
            (Some(host), Some(boot), Some(ns), Some(ticks)) => {
                let (pid_ns, time_ns) = ns.split_once(':')?;
                let place = Place {
                    host: host.to_owned(),
                    boot: hex16(boot).filter(|b| b == boot)?,
                    pid_ns: number(pid_ns)?,
                    time_ns: number(time_ns)?,
                    machine: match machine {
                        Some(m) => Some(hex16(m).filter(|h| h == m)?),
                        None => None,
                    },
                };
                Some((place, number(ticks)?))
            }
            _ => return None,
        };
        let drainer = match drainer {
            Some(n) => Some(number(n)?),
            None => None,
        };
        Some(Owner {
            pid,
            started,
            place,
            drainer,
        })
    }
}

/// A decimal number without sign or leading `+`, as the owner writes them.
fn number<T: std::str::FromStr>(word: &str) -> Option<T> {
    if word.is_empty() || !word.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    word.parse().ok()
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} started {}", self.pid, self.started)?;
        if let Some((place, ticks)) = &self.place {
            write!(
                f,
                " on {} boot {} ns {}:{} ticks {ticks}",
                place.host, place.boot, place.pid_ns, place.time_ns
            )?;
            if let Some(machine) = &place.machine {
                write!(f, " machine {machine}")?;
            }
        }
        if let Some(n) = self.drainer {
            write!(f, " drainer {n}")?;
        }
        Ok(())
    }
}

/// What `/proc` says of a pid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Probe {
    /// No process has the pid, and `/proc` shows every process (no `hidepid`).
    Gone,
    /// A process has the pid: its start in clock ticks since boot, and whether it is a zombie
    /// (exited, not yet reaped).
    Running {
        /// Field 22 of its `stat`.
        start_ticks: u64,
        /// Its state is `Z` or `X`.
        zombie: bool,
    },
    /// `/proc` could not say (not readable, not understood, hidden).
    Unknown,
}

/// Why an owner is provably dead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Death {
    /// No process has its pid on its host, boot and namespaces.
    Gone,
    /// Its pid now names a process that started at another time.
    PidReused,
    /// Its process has exited and waits to be reaped.
    Zombie,
    /// Its host has rebooted since it claimed.
    Rebooted,
}

impl fmt::Display for Death {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Death::Gone => "its process is gone",
            Death::PidReused => "its pid now belongs to a process that started later",
            Death::Zombie => "its process has exited",
            Death::Rebooted => "its host has rebooted since",
        })
    }
}

/// Whether `owner` is provably dead, judged by a process that runs at `here` (`None`: it
/// cannot tell where it runs, and proves nothing); `probe` reads `/proc` for a pid, and is
/// asked only when the owner runs at the same place. `None` unless death is proved (see the
/// module documentation).
pub(crate) fn verdict(owner: &Owner, here: Option<&Place>, probe: impl FnOnce(u32) -> Probe) -> Option<Death> {
    let here = here?;
    let (there, ticks) = owner.place.as_ref()?;
    if there.host != here.host {
        return None;
    }
    if there.boot != here.boot {
        let same_machine = there.machine.is_some() && there.machine == here.machine;
        let outside_containers = there.pid_ns == INIT_PID_NS && here.pid_ns == INIT_PID_NS;
        return (same_machine && outside_containers).then_some(Death::Rebooted);
    }
    if (there.pid_ns, there.time_ns) != (here.pid_ns, here.time_ns) {
        return None;
    }
    match probe(owner.pid) {
        Probe::Gone => Some(Death::Gone),
        Probe::Running { start_ticks, .. } if start_ticks != *ticks => Some(Death::PidReused),
        Probe::Running { zombie: true, .. } => Some(Death::Zombie),
        Probe::Running { .. } | Probe::Unknown => None,
    }
}

/// The pid, state and start time (clock ticks since boot) of a `/proc/PID/stat` text; `None`
/// if it does not read as one. The command name (field 2, in parentheses) may hold spaces and
/// parentheses: the fields after it are read from its last `)`.
pub(crate) fn parse_stat(text: &str) -> Option<(u32, char, u64)> {
    let (head, rest) = text.rsplit_once(')')?;
    let (pid, _comm) = head.split_once(" (")?;
    let pid = number(pid.trim())?;
    // Fields 3 (the state) to 22 (the start time) follow.
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?;
    let mut chars = state.chars();
    let state = match (chars.next(), chars.next()) {
        (Some(c), None) => c,
        _ => return None,
    };
    let start = fields.nth(22 - 4)?;
    Some((pid, state, number(start)?))
}

/// Whether the `proc` file system mounted at `/proc`, as `/proc/self/mountinfo` lists it,
/// shows every process: mounted, and without `hidepid` (which hides other users' processes,
/// so that a missing `/proc/PID` proves nothing).
pub(crate) fn proc_shows_every_pid(mountinfo: &str) -> bool {
    let mut found = false;
    for line in mountinfo.lines() {
        let Some((mount, fs)) = line.split_once(" - ") else {
            continue;
        };
        if mount.split(' ').nth(4) != Some("/proc") {
            continue;
        }
        let mut fs = fs.split(' ');
        if fs.next() != Some("proc") {
            // Something else mounted over /proc.
            found = false;
            continue;
        }
        let options = fs.nth(1).unwrap_or("");
        let hides = options
            .split(',')
            .filter_map(|o| o.strip_prefix("hidepid="))
            .any(|v| v != "0" && v != "off");
        found = !hides;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place() -> Place {
        Place::new(
            "web-1",
            "8c50d1c7-7560-491f-977a-1ef08b851510",
            INIT_PID_NS,
            4_026_531_834,
            Some("3d1219c7c4c5404aaa1f6d2a48adfda4"),
        )
        .unwrap()
    }

    fn owner(place: Option<Place>) -> Owner {
        Owner {
            pid: 923,
            started: 1_796_146_740_065_337_846,
            place: place.map(|p| (p, 208_231)),
            drainer: None,
        }
    }

    #[test]
    fn an_owner_reads_back_as_written_and_keeps_the_old_readable_start() {
        let with_place = owner(Some(place()));
        let text = with_place.to_string();
        assert_eq!(
            text,
            "pid 923 started 1796146740065337846 on web-1 boot 8c50d1c77560491f ns 4026531836:4026531834 \
             ticks 208231 machine 3d1219c7c4c5404a"
        );
        assert_eq!(Owner::parse(&text), Some(with_place.clone()));
        let drainer = Owner {
            drainer: Some(3),
            ..with_place
        };
        assert!(drainer.to_string().ends_with(" machine 3d1219c7c4c5404a drainer 3"));
        assert_eq!(Owner::parse(&drainer.to_string()), Some(drainer));
        // Without a machine id, and without a place (an older build's owners read too).
        let mut no_machine = place();
        no_machine.machine = None;
        let o = owner(Some(no_machine));
        assert_eq!(Owner::parse(&o.to_string()), Some(o));
        for old in ["pid 923 started 1796146740065337846", "pid 7 started 1 drainer 2"] {
            let o = Owner::parse(old).expect("an older build's owner");
            assert!(o.place.is_none());
            assert_eq!(o.to_string(), old);
        }
    }

    #[test]
    fn what_is_not_an_owner_does_not_parse() {
        let good = owner(Some(place())).to_string();
        for bad in [
            "",
            "drainer-1",
            "a drain that died",
            "pid",
            "pid x started 1",
            "pid -1 started 1",
            "pid +1 started 1",
            "pid 99999999999 started 1",
            "pid 1 started",
            "pid 1 begun 2",
            "pid 1 started 2 ",
            "pid 1  started 2",
            "pid 1 started 2 drainer",
            "pid 1 started 2 drainer x",
            "pid 1 started 2 drainer 1 drainer 2",
            "pid 1 started 2 colour blue",
            // A place in part.
            "pid 1 started 2 on web-1",
            "pid 1 started 2 on web-1 boot 8c50d1c77560491f ns 1:2",
            "pid 1 started 2 machine 3d1219c7c4c5404a",
            // Damaged parts.
            "pid 1 started 2 on web-1 boot 8c50 ns 1:2 ticks 3",
            "pid 1 started 2 on web-1 boot 8C50D1C77560491F ns 1:2 ticks 3",
            "pid 1 started 2 on web-1 boot 8c50d1c77560491f ns 12 ticks 3",
            "pid 1 started 2 on web-1 boot 8c50d1c77560491f ns 1:2 ticks -3",
            "pid 1 started 2 on web-1 boot 8c50d1c77560491f ns 1:2 ticks 3 machine zz",
            "pid 1 started 2 on web-1 boot 8c50d1c77560491f ns 1:2 ticks 3 on web-2",
        ] {
            assert_eq!(Owner::parse(bad), None, "{bad:?}");
        }
        assert_eq!(Owner::parse(&format!("{good} extra")), None);
        assert_eq!(Owner::parse(&good[..good.len() - 1]), None, "a machine id cut short");
    }

    #[test]
    fn a_place_needs_a_writable_host_and_a_boot_id() {
        assert!(Place::new("", "8c50d1c7-7560-491f-977a-1ef08b851510", 1, 2, None).is_none());
        assert!(Place::new("a host", "8c50d1c7-7560-491f-977a-1ef08b851510", 1, 2, None).is_none());
        assert!(Place::new("web\u{7}", "8c50d1c7-7560-491f-977a-1ef08b851510", 1, 2, None).is_none());
        assert!(Place::new("web", "not a boot id", 1, 2, None).is_none());
        assert!(Place::new("web", "8c50d1c7", 1, 2, None).is_none());
        // A trailing newline (as /proc gives them) is not part of the name.
        let p = Place::new("web\n", "8c50d1c7-7560-491f-977a-1ef08b851510\n", 1, 2, Some("bad")).unwrap();
        assert_eq!(
            (p.host.as_str(), p.boot.as_str(), p.machine),
            ("web", "8c50d1c77560491f", None)
        );
    }

    fn running(start_ticks: u64) -> Probe {
        Probe::Running {
            start_ticks,
            zombie: false,
        }
    }

    #[test]
    fn death_is_proved_on_the_same_host_boot_and_namespaces_only() {
        let here = place();
        let o = owner(Some(place()));
        // Alive: the pid runs, started at the owner's tick.
        assert_eq!(verdict(&o, Some(&here), |_| running(208_231)), None);
        // Gone, reused, a zombie.
        assert_eq!(verdict(&o, Some(&here), |_| Probe::Gone), Some(Death::Gone));
        assert_eq!(verdict(&o, Some(&here), |_| running(208_232)), Some(Death::PidReused));
        let zombie = Probe::Running {
            start_ticks: 208_231,
            zombie: true,
        };
        assert_eq!(verdict(&o, Some(&here), |_| zombie), Some(Death::Zombie));
        // /proc does not answer.
        assert_eq!(verdict(&o, Some(&here), |_| Probe::Unknown), None);
        // The probe is asked for the owner's pid.
        let mut asked = None;
        verdict(&o, Some(&here), |pid| {
            asked = Some(pid);
            Probe::Unknown
        });
        assert_eq!(asked, Some(923));

        let never = |_| -> Probe { panic!("/proc was read for an owner of another place") };
        // Another host, even with every other part equal.
        let mut other = place();
        other.host = "web-2".into();
        assert_eq!(verdict(&owner(Some(other)), Some(&here), never), None);
        // Another pid or time namespace (a container): its pids are not ours.
        let mut other = place();
        other.pid_ns += 1;
        assert_eq!(verdict(&owner(Some(other)), Some(&here), never), None);
        let mut other = place();
        other.time_ns += 1;
        assert_eq!(verdict(&owner(Some(other)), Some(&here), never), None);
        // No place (an older build), or a reader that cannot tell where it runs.
        assert_eq!(verdict(&owner(None), Some(&here), never), None);
        assert_eq!(verdict(&o, None, never), None);
    }

    #[test]
    fn a_reboot_is_proved_only_by_the_same_machine_outside_containers() {
        let here = place();
        let mut before = place();
        before.boot = "0123456789abcdef".into();
        let never = |_| -> Probe { panic!("/proc was read for an owner of another boot") };
        assert_eq!(
            verdict(&owner(Some(before.clone())), Some(&here), never),
            Some(Death::Rebooted)
        );
        // Another machine with the same host name (`localhost`, a cloned container's name).
        let mut other = before.clone();
        other.machine = Some("fedcba9876543210".into());
        assert_eq!(verdict(&owner(Some(other)), Some(&here), never), None);
        // No machine id on either side.
        let mut other = before.clone();
        other.machine = None;
        assert_eq!(verdict(&owner(Some(other)), Some(&here), never), None);
        let mut bare = here.clone();
        bare.machine = None;
        assert_eq!(verdict(&owner(Some(before.clone())), Some(&bare), never), None);
        // In a container's pid namespace (an image may carry its machine id everywhere).
        let mut contained = before.clone();
        contained.pid_ns = 4_026_532_500;
        assert_eq!(verdict(&owner(Some(contained)), Some(&here), never), None);
        let mut contained_here = here.clone();
        contained_here.pid_ns = 4_026_532_500;
        assert_eq!(verdict(&owner(Some(before)), Some(&contained_here), never), None);
    }

    #[test]
    fn a_stat_line_reads_through_a_command_name_with_spaces_and_parentheses() {
        let line = "16916 (cat) R 16911 16911 523 0 -1 4194304 102 0 0 0 0 0 0 0 20 0 1 0 208231 3133440 387 \
                    18446744073709551615 94335107788800 0\n";
        assert_eq!(parse_stat(line), Some((16916, 'R', 208_231)));
        let odd = "42 (a) b (c) ) Z 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 77 0 0";
        assert_eq!(parse_stat(odd), Some((42, 'Z', 77)));
        for bad in [
            "",
            "garbage",
            "42 (x) R 1 2 3",
            "x (cat) R 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 77 0",
            "42 (cat) RR 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 77 0",
            "42 (cat) R 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 -77 0",
        ] {
            assert_eq!(parse_stat(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn hidepid_or_no_proc_at_slash_proc_means_a_missing_pid_proves_nothing() {
        let plain = "22 27 0:21 / /proc rw,relatime - proc proc rw\n23 22 0:5 / /dev rw - devtmpfs udev rw";
        assert!(proc_shows_every_pid(plain));
        assert!(proc_shows_every_pid("22 27 0:21 / /proc rw - proc proc rw,hidepid=0"));
        assert!(proc_shows_every_pid("22 27 0:21 / /proc rw - proc proc rw,hidepid=off"));
        for hidden in [
            "hidepid=2",
            "hidepid=invisible",
            "hidepid=1",
            "hidepid=noaccess",
            "hidepid=ptraceable",
        ] {
            let line = format!("22 27 0:21 / /proc rw,relatime - proc proc rw,{hidden},gid=4");
            assert!(!proc_shows_every_pid(&line), "{hidden}");
        }
        // Only the mount at /proc counts (a container's read-only /proc/sys is another).
        assert!(!proc_shows_every_pid("30 22 0:21 /sys /proc/sys ro - proc proc rw"));
        assert!(!proc_shows_every_pid(""));
        // Something mounted over /proc hides it; the last mount at /proc is the one seen.
        assert!(!proc_shows_every_pid(
            "22 27 0:21 / /proc rw - proc proc rw\n40 22 0:50 / /proc rw - tmpfs none rw"
        ));
        assert!(proc_shows_every_pid(
            "22 27 0:21 / /proc rw - proc proc rw,hidepid=2\n41 22 0:51 / /proc rw - proc proc rw"
        ));
    }
}
