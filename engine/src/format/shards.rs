//! A model as one file or as shards (spec §10): `{base}-{no:05}-of-{count:05}.cmf`. Any
//! shard's name opens the whole set: the name is normalised to shard 1 and the siblings
//! are found by the pattern. Each shard stays a complete, independently valid file; the
//! merged directory remembers which shard holds each tensor (never written to disk).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::directory::TensorEntry;
use super::error::{parse, FormatError, Result};
use super::file::CmfFile;
use super::header::Header;

/// Parses `{base}-{no:05}-of-{count:05}.cmf` into (base, no, count).
pub fn parse_shard_name(path: &Path) -> Option<(String, u32, u32)> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".cmf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (base, no) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() >= 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) {
        return None;
    }
    Some((base.to_string(), no.parse().ok()?, count.parse().ok()?))
}

fn sibling(path: &Path, base: &str, no: u32, count: u32) -> PathBuf {
    path.with_file_name(format!("{base}-{no:05}-of-{count:05}.cmf"))
}

/// A tensor of the merged directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorRef {
    pub shard: usize,
    pub index: usize,
}

/// One model: a single file, or every shard of a set in order.
#[derive(Debug)]
pub struct CmfModel {
    pub shards: Vec<CmfFile>,
    order: Vec<TensorRef>,
    by_name: HashMap<String, TensorRef>,
}

impl CmfModel {
    /// Opens a plain file or a whole shard set from any member's name.
    pub fn open(path: impl AsRef<Path>) -> Result<CmfModel> {
        let path = path.as_ref();
        let by_name = parse_shard_name(path);
        let first_path = match &by_name {
            Some((base, _, count)) => sibling(path, base, 1, *count),
            None => path.to_path_buf(),
        };
        let first = CmfFile::open(&first_path)?;
        let Some(info) = first.header.shard else {
            return CmfModel::from_files(vec![first]);
        };
        if info.no != 1 {
            return Err(parse(format!(
                "{} is shard {} of {}: open the set by its shard names ({{base}}-00001-of-{:05}.cmf)",
                path.display(),
                info.no,
                info.count,
                info.count
            )));
        }
        let Some((base, _, count)) = by_name else {
            if info.count == 1 {
                return CmfModel::from_files(vec![first]);
            }
            return Err(parse(format!(
                "{} is shard 1 of {} but its name does not follow {{base}}-00001-of-{:05}.cmf, so its siblings cannot be found",
                path.display(),
                info.count,
                info.count
            )));
        };
        if count != info.count {
            return Err(parse(format!(
                "the file name says {count} shards but the header of shard 1 says {}",
                info.count
            )));
        }
        let mut files = vec![first];
        for no in 2..=count {
            let p = sibling(path, &base, no, count);
            if !p.exists() {
                return Err(FormatError::io(
                    format!("shard {no} of {count} ({})", p.display()),
                    std::io::Error::new(std::io::ErrorKind::NotFound, "missing shard"),
                ));
            }
            let f = CmfFile::open(&p)?;
            match f.header.shard {
                Some(s) if s.no == no && s.count == count => {}
                other => {
                    return Err(parse(format!(
                        "{} should be shard {no} of {count} but its header says {}",
                        p.display(),
                        other
                            .map(|s| format!("{} of {}", s.no, s.count))
                            .unwrap_or_else(|| "it is not a shard".into())
                    )))
                }
            }
            files.push(f);
        }
        CmfModel::from_files(files)
    }

    /// Merges the directories of already-open files (in shard order).
    pub fn from_files(shards: Vec<CmfFile>) -> Result<CmfModel> {
        let mut order = Vec::new();
        let mut by_name = HashMap::new();
        for (s, f) in shards.iter().enumerate() {
            for (i, e) in f.directory.iter().enumerate() {
                let r = TensorRef { shard: s, index: i };
                if by_name.insert(e.name.clone(), r).is_some() {
                    return Err(parse(format!(
                        "tensor {:?} appears in more than one shard",
                        super::escape_str(&e.name)
                    )));
                }
                order.push(r);
            }
        }
        Ok(CmfModel {
            shards,
            order,
            by_name,
        })
    }

    /// Shard 1: the one that carries header, masks, vocab, chat bundle and skills.
    pub fn primary(&self) -> &CmfFile {
        &self.shards[0]
    }

    pub fn header(&self) -> &Header {
        &self.shards[0].header
    }

    pub fn is_sharded(&self) -> bool {
        self.shards.len() > 1 || self.shards[0].header.shard.is_some()
    }

    pub fn tensor_count(&self) -> usize {
        self.order.len()
    }

    /// Every tensor in shard order, with the shard index.
    pub fn tensors(&self) -> impl Iterator<Item = (usize, &TensorEntry)> + '_ {
        self.order
            .iter()
            .map(|r| (r.shard, &self.shards[r.shard].directory.entries[r.index]))
    }

    pub fn get(&self, name: &str) -> Option<(usize, &TensorEntry)> {
        let r = self.by_name.get(name)?;
        Some((r.shard, &self.shards[r.shard].directory.entries[r.index]))
    }

    /// The stored bytes of a tensor, from whichever shard holds it.
    pub fn tensor_bytes(&self, name: &str) -> Option<&[u8]> {
        let (s, e) = self.get(name)?;
        Some(self.shards[s].tensor_bytes(e))
    }

    pub fn total_bytes(&self) -> u64 {
        self.shards.iter().map(|f| f.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names() {
        assert_eq!(
            parse_shard_name(Path::new("/x/model-00002-of-00005.cmf")),
            Some(("model".into(), 2, 5))
        );
        assert_eq!(
            parse_shard_name(Path::new("a-b-00001-of-00002.cmf")),
            Some(("a-b".into(), 1, 2))
        );
        assert_eq!(parse_shard_name(Path::new("model.cmf")), None);
        assert_eq!(parse_shard_name(Path::new("model-1-of-2.cmf")), None);
    }
}
