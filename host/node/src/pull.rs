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
        let (auth, unresolved) = match ImageRef::parse(reference) {
            Ok(r) => match self
                .credentials
                .resolve(r.registry(), r.repository(), reference)
                .await
            {
                Ok(credential) => (credential.map(auth_config), None),
                Err(why) => (None, Some(why)),
            },
            Err(_) => (None, None),
        };
        self.cri
            .pull_image(reference, auth)
            .await
            .map(drop)
            .map_err(|e| PullFailure {
                no_space: e.is_no_space(),
                permanent: e.is_permanent(),
                message: match unresolved {
                    Some(why) => format!(
                        "{e} (pulled without a credential: the image credential provider failed: {why})"
                    ),
                    None => e.to_string(),
                },
            })
    }
}

/// A credential as the runtime is given it. No `server_address`, as from the kubelet: containerd
/// parses it as a URL and fails the pull on `host:port` (no scheme), or drops the credential
/// unless the URL's host is exactly the one it pulls from (not for Docker Hub's endpoint or a
/// mirror).
fn auth_config(c: pinset_registry::auth::Credential) -> AuthConfig {
    AuthConfig {
        username: c.username,
        password: c.password,
        ..Default::default()
    }
}
