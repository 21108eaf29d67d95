//! Pulls through CRI, with the credentials of the image's registry.

use crate::cri::client::CriClient;
use crate::cri::proto::AuthConfig;
use crate::executor::{PullFailure, Puller};
use pinset_core::reference::ImageRef;
use pinset_registry::auth::Credentials;
use std::sync::Arc;

/// The executor's [`Puller`] over CRI `PullImage`.
#[derive(Clone)]
pub struct CriPuller {
    pub cri: CriClient,
    pub credentials: Arc<Credentials>,
}

impl Puller for CriPuller {
    async fn pull(&self, reference: &str) -> Result<(), PullFailure> {
        let auth = match ImageRef::parse(reference) {
            Ok(r) => self
                .credentials
                .resolve(r.registry(), r.repository(), reference)
                .await
                // No `server_address`, as from the kubelet: containerd parses it as a URL and
                // fails the pull on `host:port` (no scheme), or drops the credential unless the
                // URL's host is exactly the one it pulls from (not for Docker Hub's endpoint or
                // a mirror).
                .map(|c| AuthConfig {
                    username: c.username,
                    password: c.password,
                    ..Default::default()
                }),
            Err(_) => None,
        };
        self.cri
            .pull_image(reference, auth)
            .await
            .map(drop)
            .map_err(|e| PullFailure {
                no_space: e.is_no_space(),
                permanent: e.is_permanent(),
                message: e.to_string(),
            })
    }
}
