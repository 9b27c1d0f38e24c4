//! The layered map against a model (many clones, writes, drops, folds and copies).
#![allow(dead_code, unused)]

#[path = "../src/state/layered.rs"]
mod layered;

use layered::tests::Pair;
use layered::Layered;
use std::collections::HashMap;

use reactifact_core::fastrand::Rng;

fn check(map: &Layered<u32, Pair>, model: &HashMap<u32, u32>, keys: u32) {
    assert_eq!(map.len(), model.len(), "len");
    for (k, v) in map.iter() {
        assert_eq!(*k, v.0, "an entry's key is its value's");
    }
    let mut got: Vec<_> = map.iter().map(|(k, v)| (*k, v.1)).collect();
    got.sort_unstable();
    let mut want: Vec<_> = model.iter().map(|(k, v)| (*k, *v)).collect();
    want.sort_unstable();
    assert_eq!(got, want, "iter");
    for k in 0..keys {
        assert_eq!(
            map.get(&k).map(|p| (p.0, p.1)),
            model.get(&k).map(|&v| (k, v)),
            "get {k}"
        );
    }
}

#[test]
fn layered_matches_a_model_under_clones_writes_and_drops() {
    for seed in 1..=12u64 {
        let mut rng = Rng::with_seed(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let keys = [40u32, 3000, 20_000][(seed % 3) as usize];
        let mut maps: Vec<Layered<u32, Pair>> = vec![Layered::default()];
        let mut models: Vec<HashMap<u32, u32>> = vec![HashMap::new()];
        for step in 0..60_000u32 {
            let i = rng.u64(..maps.len() as u64) as usize;
            match rng.u64(..1000) {
                0..=5 if maps.len() < 8 => {
                    let c = maps[i].clone();
                    maps.push(c);
                    let m = models[i].clone();
                    models.push(m);
                }
                6..=9 if maps.len() > 1 => {
                    maps.swap_remove(i);
                    models.swap_remove(i);
                }
                10 => check(&maps[i], &models[i], keys),
                _ => {
                    let k = rng.u64(..u64::from(keys)) as u32;
                    let v = if rng.u64(..4) == 0 { None } else { Some(step) };
                    let old = maps[i].set(&k, v.map(|v| Pair(k, v))).map(|p| p.1);
                    let model_old = match v {
                        Some(v) => models[i].insert(k, v),
                        None => models[i].remove(&k),
                    };
                    assert_eq!(old, model_old, "seed {seed} step {step}: old value");
                }
            }
        }
        for (m, model) in maps.iter().zip(&models) {
            check(m, model, keys);
        }
    }
}
