//! Image sizes: compressed bytes per layer, resolved for the node's platform, cached by digest.

use crate::core::reference::ImageRef;
use std::collections::HashMap;
use std::sync::Mutex;

/// An image's compressed layers for this node's platform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageSize {
    /// (layer digest, compressed bytes).
    pub layers: Vec<(String, u64)>,
}

impl ImageSize {
    pub fn total(&self) -> u64 {
        self.layers.iter().map(|(_, s)| s).sum()
    }
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("sizing {image}: {why}")]
pub struct SizeError {
    pub image: String,
    pub why: String,
}

/// Where sizes come from: a registry, or a table in tests and the demo.
pub trait Sizer: Send + Sync {
    fn size(&self, image: &ImageRef) -> impl Future<Output = Result<ImageSize, SizeError>> + Send;
}

/// A fixed table: reference → layers.
#[derive(Clone, Debug, Default)]
pub struct TableSizer {
    pub table: HashMap<String, ImageSize>,
}

impl Sizer for TableSizer {
    async fn size(&self, image: &ImageRef) -> Result<ImageSize, SizeError> {
        self.table.get(image.as_str()).cloned().ok_or_else(|| SizeError {
            image: image.to_string(),
            why: "not in the size table".into(),
        })
    }
}

/// Sizes never change for a digest: cache them for the life of the process.
pub struct Cached<S> {
    inner: S,
    cache: Mutex<HashMap<String, ImageSize>>,
}

impl<S: Sizer> Cached<S> {
    pub fn new(inner: S) -> Self {
        Self { inner, cache: Mutex::new(HashMap::new()) }
    }

    pub async fn size(&self, image: &ImageRef) -> Result<ImageSize, SizeError> {
        if let Some(hit) = self.cache.lock().expect("size cache").get(image.digest()) {
            return Ok(hit.clone());
        }
        let size = self.inner.size(image).await?;
        self.cache.lock().expect("size cache").insert(image.digest().to_string(), size.clone());
        Ok(size)
    }

    pub fn cached(&self) -> usize {
        self.cache.lock().expect("size cache").len()
    }
}
