//! Fair claims: sessions take turns. When more sessions wait than a claim takes, which of
//! them go first is drawn anew for every claim, so that none waits behind the others for
//! long; this is the draw.

use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh draw for one claim: successive draws order sessions differently.
pub fn draw() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0x2545_F491_4F6C_DD1D);
    NEXT.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
}

/// The place of a session (`session`: a hash of its name, or an id) in the turns of a claim
/// with `draw`: the sessions with the smallest places go first.
pub fn place(session: u64, draw: u64) -> u64 {
    let mut x = session ^ draw;
    // splitmix64's finaliser: every bit of the session and the draw moves the place.
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_of_two_sessions_goes_first_in_about_half_of_the_draws() {
        let first = (0..1_000)
            .filter(|_| {
                let d = draw();
                place(1, d) < place(2, d)
            })
            .count();
        assert!((350..=650).contains(&first), "{first} of 1000");
    }
}
