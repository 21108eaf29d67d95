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
        let auth = ImageRef::parse(reference).ok().and_then(|r| {
            let c = self.credentials.lookup(r.registry(), r.repository())?;
            Some(AuthConfig {
                username: c.username.clone(),
                password: c.password.clone(),
                server_address: r.registry().to_string(),
                ..Default::default()
            })
        });
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
