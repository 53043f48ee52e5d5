//! The sparse index section (spec §7): per (task, layer) active FFN groups and heads.
//! Deprecated by the spec: read and shown, never written.

use super::error::{bounds, parse, Result};

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct IndexEntry {
    pub task_id: u32,
    pub layer_idx: u32,
    /// Active FFN quantization groups (32 neurons each), sorted.
    pub groups: Vec<u16>,
    /// Active heads, sorted.
    pub heads: Vec<u8>,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

/// Parses the whole section; every entry must lie inside it and be sorted.
pub fn parse_index(section: &[u8]) -> Result<Vec<IndexEntry>> {
    let short = |what: &str| {
        bounds(format!(
            "sparse index: {what} runs past the {}-byte section",
            section.len()
        ))
    };
    let n = u32_at(section, 0).ok_or_else(|| short("head"))?;
    let reserved = u32_at(section, 4).ok_or_else(|| short("head"))?;
    if reserved != 0 {
        return Err(parse(format!(
            "sparse index: reserved word is {reserved}, must be 0"
        )));
    }
    let mut at = 8usize;
    // Each entry takes at least 16 bytes: bound the allocation by what the section can hold.
    let mut out = Vec::with_capacity((n as usize).min(section.len() / 16));
    for i in 0..n {
        let task_id = u32_at(section, at).ok_or_else(|| short(&format!("entry {i}")))?;
        let layer_idx = u32_at(section, at + 4).ok_or_else(|| short(&format!("entry {i}")))?;
        let n_groups =
            u32_at(section, at + 8).ok_or_else(|| short(&format!("entry {i}")))? as usize;
        let n_heads =
            u32_at(section, at + 12).ok_or_else(|| short(&format!("entry {i}")))? as usize;
        at += 16;
        let body = n_groups
            .checked_mul(2)
            .and_then(|g| g.checked_add(n_heads))
            .filter(|&b| at.checked_add(b).is_some_and(|e| e <= section.len()))
            .ok_or_else(|| short(&format!("entry {i}")))?;
        let groups: Vec<u16> = section[at..at + 2 * n_groups]
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        let heads = section[at + 2 * n_groups..at + body].to_vec();
        if !groups.windows(2).all(|w| w[0] < w[1]) || !heads.windows(2).all(|w| w[0] < w[1]) {
            return Err(parse(format!(
                "sparse index entry {i}: indices are not strictly sorted"
            )));
        }
        at = (at + body).next_multiple_of(4);
        out.push(IndexEntry {
            task_id,
            layer_idx,
            groups,
            heads,
        });
    }
    if at < section.len() {
        return Err(bounds(format!(
            "sparse index: {} trailing bytes after {n} entries",
            section.len() - at
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let mut s = vec![1, 0, 0, 0, 0, 0, 0, 0];
        for w in [7u32, 2, 2, 3] {
            s.extend_from_slice(&w.to_le_bytes());
        }
        s.extend_from_slice(&[0, 0, 1, 0, 0, 1, 2, 0]); // groups 0,1; heads 0,1,2; pad 1
        let e = parse_index(&s).unwrap();
        assert_eq!(e[0].groups, vec![0, 1]);
        assert_eq!(e[0].heads, vec![0, 1, 2]);
        assert!(parse_index(&s[..s.len() - 2]).is_err());
        let mut t = s.clone();
        t[0] = 200;
        assert!(parse_index(&t).is_err());
        let mut t = s.clone();
        t[24] = 5; // groups not sorted
        assert!(parse_index(&t).is_err());
    }
}
