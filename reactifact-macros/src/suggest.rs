//! "Did you mean" hints for misspelt options.

/// The candidate at edit distance at most 2 from `word`, if any.
pub(crate) fn closest(word: &str, candidates: &[&'static str]) -> Option<&'static str> {
    candidates
        .iter()
        .map(|c| (edit_distance(word, c), *c))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous + usize::from(ca != *cb);
            previous = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::closest;

    #[test]
    fn suggests_near_misses_only() {
        assert_eq!(closest("also_create", &["also_creates", "name"]), Some("also_creates"));
        assert_eq!(closest("nmae", &["also_creates", "name"]), Some("name"));
        assert_eq!(closest("priority", &["also_creates", "name"]), None);
    }
}
