//! A model as one file or as shards (spec §10): `{base}-{no:05}-of-{count:05}.cmf`. Any
//! shard's name opens the whole set: the name is normalised to shard 1 and the siblings
//! are found by the pattern. Each shard stays a complete, independently valid file; the
//! merged directory remembers which shard holds each tensor (never written to disk).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    /// Shared, so that a caller can keep one shard (the primary) without the whole set.
    pub shards: Vec<Arc<CmfFile>>,
    order: Vec<TensorRef>,
    /// `starts[s]`: the merged index of shard `s`'s first tensor.
    starts: Vec<usize>,
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
        CmfModel::from_shared(shards.into_iter().map(Arc::new).collect())
    }

    /// [`CmfModel::from_files`] for files already shared.
    pub fn from_shared(shards: Vec<Arc<CmfFile>>) -> Result<CmfModel> {
        let mut order = Vec::new();
        let mut starts = Vec::with_capacity(shards.len());
        let mut by_name = HashMap::new();
        for (s, f) in shards.iter().enumerate() {
            starts.push(order.len());
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
            starts,
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
    pub fn tensors(&self) -> impl Iterator<Item = (usize, &TensorEntry)> + Clone + '_ {
        self.order
            .iter()
            .map(|r| (r.shard, &self.shards[r.shard].directory.entries[r.index]))
    }

    /// The `k`-th tensor of the merged directory (shard order, as [`CmfModel::tensors`]),
    /// with its shard index: random access for views that keep index vectors.
    pub fn tensor_at(&self, k: usize) -> Option<(usize, &TensorEntry)> {
        let r = self.order.get(k)?;
        Some((r.shard, &self.shards[r.shard].directory.entries[r.index]))
    }

    /// The merged index of entry `index` of shard `shard`'s own directory.
    pub fn merged_index(&self, shard: usize, index: usize) -> Option<usize> {
        let start = *self.starts.get(shard)?;
        (index < self.shards[shard].directory.len()).then_some(start + index)
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

    #[test]
    fn merged_directory_is_indexed_by_shard() {
        use crate::format::writer::{self, TensorPlan, WriteSpec};
        use crate::format::DType;
        let dir = std::env::temp_dir().join(format!(
            "cortiq-shards-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("m.cmf");
        // Rough f32 sizes 16, 32, 16 against a limit of 40: shards [a], [b], [c].
        let plan = |name: &str, n: u64| TensorPlan {
            name: name.into(),
            dtype: DType::F16,
            shape: vec![n],
        };
        let spec = WriteSpec {
            tensors: vec![plan("a", 4), plan("b", 8), plan("c", 4)],
            ..Default::default()
        };
        let payloads: Vec<Vec<u8>> = [4u8, 8, 4]
            .iter()
            .map(|&n| vec![n; 2 * n as usize])
            .collect();
        writer::write_sharded(&out, spec, 20, |i| {
            Ok(std::borrow::Cow::Borrowed(payloads[i].as_slice()))
        })
        .unwrap();
        let m = CmfModel::open(writer::shard_name(&out, 3, 3)).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(m.shards.len(), 3);
        let names: Vec<(usize, &str)> = (0..m.tensor_count())
            .map(|k| m.tensor_at(k).map(|(s, e)| (s, e.name.as_str())).unwrap())
            .collect();
        assert_eq!(names, [(0, "a"), (1, "b"), (2, "c")]);
        assert!(m.tensor_at(3).is_none());
        assert_eq!(m.merged_index(1, 0), Some(1));
        assert_eq!(m.merged_index(2, 0), Some(2));
        assert_eq!(m.merged_index(1, 1), None);
        assert_eq!(m.merged_index(3, 0), None);
        assert!(m.tensors().eq((0..3).map(|k| m.tensor_at(k).unwrap())));
        // The primary can be kept on its own.
        let primary = Arc::clone(&m.shards[0]);
        drop(m);
        assert_eq!(primary.header.shard.map(|s| s.no), Some(1));
    }
}
