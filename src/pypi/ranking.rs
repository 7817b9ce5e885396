//! Matching the query against the cached names and keeping the best few, in one streaming pass.

use std::io::{self, BufRead, BufReader};
use std::path::Path;

use super::{normalize, MatchKind, SearchError, MAX_QUERY_LEN, MAX_RESULTS};

/// Largest edit distance of a close match.
const MAX_CLOSE_DISTANCE: usize = 2;
/// Shortest query that gets close matches.
const MIN_CLOSE_QUERY_LEN: usize = 4;

#[derive(Debug, Clone)]
pub(super) struct Query {
    /// Each normalized word, without leading or trailing `-`.
    pub(super) words: Vec<String>,
    /// The words joined with `-`: what names are compared with.
    pub(super) joined: String,
}

impl Query {
    pub(super) fn parse(raw: &str) -> Result<Query, SearchError> {
        let trimmed = raw.trim_matches(' ');
        if trimmed.is_empty() {
            return Err(SearchError::InvalidQuery(
                "the query is empty; give a package name or part of one, e.g. \"requests\"".into(),
            ));
        }
        let length = trimmed.chars().count();
        if length > MAX_QUERY_LEN {
            return Err(SearchError::InvalidQuery(format!(
                "the query is {length} characters long; the limit is {MAX_QUERY_LEN}"
            )));
        }
        if let Some(bad) = trimmed
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' ')))
        {
            return Err(SearchError::InvalidQuery(format!(
                "the query contains {bad:?}; only ASCII letters, digits, '-', '_', '.' and spaces \
                 can appear in a PyPI project name"
            )));
        }
        let words: Vec<String> = trimmed
            .split(' ')
            .map(|word| normalize(word).trim_matches('-').to_string())
            .filter(|word| !word.is_empty())
            .collect();
        if words.is_empty() {
            return Err(SearchError::InvalidQuery(
                "the query has no letters or digits; give a package name or part of one".into(),
            ));
        }
        let joined = words.join("-");
        Ok(Query { words, joined })
    }

    /// How `name` (normalized) matches, with the edit distance for a close match.
    fn classify(&self, name: &str, want_close: bool) -> Option<(MatchKind, usize)> {
        let q = self.joined.as_str();
        if name == q {
            return Some((MatchKind::Exact, 0));
        }
        if name.starts_with(q) {
            return Some((MatchKind::Prefix, 0));
        }
        if name.contains(q)
            || (self.words.len() > 1 && self.words.iter().all(|w| name.contains(w.as_str())))
        {
            return Some((MatchKind::Substring, 0));
        }
        if want_close && q.len() >= MIN_CLOSE_QUERY_LEN {
            if let Some(d) = osa_distance_within(name.as_bytes(), q.as_bytes(), MAX_CLOSE_DISTANCE)
            {
                return Some((MatchKind::Close, d));
            }
        }
        None
    }
}

/// Ordering of candidates: kind, then edit distance, then length, then name.
type RankKey = (u8, usize, usize, String);

/// The best [`MAX_RESULTS`] candidates seen so far, sorted.
#[derive(Default)]
struct TopK {
    best: Vec<RankKey>,
}

impl TopK {
    fn full(&self) -> bool {
        self.best.len() >= MAX_RESULTS
    }

    /// Whether a candidate of this kind could still get in.
    fn wants(&self, kind: MatchKind) -> bool {
        !self.full() || self.best.last().is_some_and(|worst| worst.0 >= kind.rank())
    }

    fn offer(&mut self, kind: MatchKind, distance: usize, name: &str) {
        let probe = (kind.rank(), distance, name.len());
        if self.full() {
            if let Some(worst) = self.best.last() {
                let worst_probe = (worst.0, worst.1, worst.2);
                if probe > worst_probe || (probe == worst_probe && name >= worst.3.as_str()) {
                    return;
                }
            }
        }
        if self.best.iter().any(|k| k.3 == name) {
            return; // a duplicate line
        }
        let key = (probe.0, probe.1, probe.2, name.to_string());
        let at = self.best.partition_point(|k| *k < key);
        self.best.insert(at, key);
        self.best.truncate(MAX_RESULTS);
    }

    fn into_ranked(self) -> Vec<(String, MatchKind)> {
        self.best
            .into_iter()
            .map(|(rank, _, _, name)| {
                let kind = match rank {
                    0 => MatchKind::Exact,
                    1 => MatchKind::Prefix,
                    2 => MatchKind::Substring,
                    _ => MatchKind::Close,
                };
                (name, kind)
            })
            .collect()
    }
}

/// Streams the name file and keeps the best matches.
pub(super) fn scan_index(path: &Path, query: &Query) -> io::Result<Vec<(String, MatchKind)>> {
    let file = std::fs::File::open(path)?;
    let mut reader = BufReader::with_capacity(128 * 1024, file);
    let mut top = TopK::default();
    let mut line = Vec::with_capacity(64);
    let query_len = query.joined.len();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        let bytes = line.strip_suffix(b"\n").unwrap_or(&line);
        let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
        if bytes.is_empty() || bytes[0] == b'#' {
            continue;
        }
        let Ok(name) = std::str::from_utf8(bytes) else {
            continue;
        };
        // Close matches cost an edit distance: only for names of a near length, and only while
        // a close match could still make the cut.
        let want_close =
            name.len().abs_diff(query_len) <= MAX_CLOSE_DISTANCE && top.wants(MatchKind::Close);
        if let Some((kind, distance)) = query.classify(name, want_close) {
            top.offer(kind, distance, name);
        }
    }
    Ok(top.into_ranked())
}

/// Optimal string alignment distance (Damerau–Levenshtein with adjacent transpositions) between
/// `a` and `b` when it is at most `max`.
fn osa_distance_within(a: &[u8], b: &[u8], max: usize) -> Option<usize> {
    pub(super) const WIDTH: usize = 128;
    if a.len().abs_diff(b.len()) > max || b.len() >= WIDTH {
        return None;
    }
    let n = b.len();
    // Rows i-2, i-1 and i of the DP table, rotated.
    let mut rows = [[0usize; WIDTH]; 3];
    for (j, cell) in rows[1].iter_mut().enumerate().take(n + 1) {
        *cell = j;
    }
    let (mut two_back, mut prev, mut cur) = (0usize, 1usize, 2usize);
    for i in 1..=a.len() {
        rows[cur][0] = i;
        let mut row_min = i;
        for j in 1..=n {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut value = (rows[prev][j] + 1)
                .min(rows[cur][j - 1] + 1)
                .min(rows[prev][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                value = value.min(rows[two_back][j - 2] + 1);
            }
            rows[cur][j] = value;
            row_min = row_min.min(value);
        }
        if row_min > max {
            return None;
        }
        (two_back, prev, cur) = (prev, cur, two_back);
    }
    let distance = rows[prev][n];
    (distance <= max).then_some(distance)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn osa_distance_counts_edits_and_transpositions() {
        assert_eq!(osa_distance_within(b"requests", b"requests", 2), Some(0));
        assert_eq!(osa_distance_within(b"reqeusts", b"requests", 2), Some(1));
        assert_eq!(osa_distance_within(b"request", b"requests", 2), Some(1));
        assert_eq!(osa_distance_within(b"rekwests", b"requests", 2), Some(2));
        assert_eq!(osa_distance_within(b"numpy", b"requests", 2), None);
        assert_eq!(osa_distance_within(b"abcdefgh", b"ab", 2), None);
    }

    #[test]
    fn query_validation() {
        for bad in [
            "",
            "   ",
            "-_.",
            "requests!",
            "naïve",
            "a/b",
            &"x".repeat(101),
        ] {
            let err = Query::parse(bad).expect_err(bad);
            assert!(matches!(err, SearchError::InvalidQuery(_)), "{bad}: {err}");
        }
        let q = Query::parse(" Flask  Login ").expect("valid");
        assert_eq!(q.joined, "flask-login");
        assert_eq!(q.words, vec!["flask", "login"]);
        assert_eq!(
            Query::parse(&"x".repeat(100))
                .expect("100 chars")
                .joined
                .len(),
            100
        );
    }
}
