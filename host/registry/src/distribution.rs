//! The OCI distribution API, as pinset uses it: read a manifest or a blob (their digests
//! checked: a registry or mirror cannot answer with other content than the digest it was asked
//! for), push a blob or a manifest. Every call goes through [`Client::send`] and so through the
//! bounded reader; an endpoint that answers over HTTPS or plain HTTP (`insecure`) is tried in the
//! runtime's order, the next scheme only when the previous got no answer at all.

use crate::client::{Client, RegistryError};
use crate::http::{Answer, HttpError, Request, Sink};
use crate::limits::{Limit, MANIFEST, UPLOAD_ANSWER};
use crate::mirrors::Endpoint;
use crate::oci::{MANIFEST_TYPES, sha256_digest};
use bytes::Bytes;
use http::{Method, StatusCode, header};
use sha2::Digest;
use std::time::Duration;

/// A manifest as served, with the digest of its bytes.
#[derive(Clone, Debug)]
pub struct Fetched {
    pub body: Bytes,
    pub digest: String,
    pub media_type: Option<String>,
}

impl Client {
    /// Send a request built for each of `endpoint`'s schemes until one gets an answer.
    async fn on_endpoint(
        &self,
        endpoint: &Endpoint,
        build: impl Fn(&str) -> Request,
        actions: &str,
        limit: Limit,
        deadline: Duration,
    ) -> Result<Answer, RegistryError> {
        let mut last = None;
        for scheme in self.schemes(endpoint) {
            match self
                .send(endpoint, build(scheme), actions, limit, deadline, None)
                .await
            {
                // The next scheme may answer (an insecure endpoint: TLS first, then plain HTTP).
                Err(RegistryError::Http(
                    e @ (HttpError::Unreachable { .. } | HttpError::PlainHttp { .. }),
                )) => {
                    last = Some(RegistryError::Http(e));
                }
                other => return other,
            }
        }
        Err(last.expect("every endpoint has a scheme"))
    }

    /// A GET built by `build` on `endpoint` (pull scope) that must succeed: the answer and the
    /// digest of its body.
    async fn pull(
        &self,
        endpoint: &Endpoint,
        build: impl Fn(&str) -> Request,
        limit: Limit,
        deadline: Duration,
    ) -> Result<(Answer, String), RegistryError> {
        let answer = self
            .on_endpoint(endpoint, build, "pull", limit, deadline)
            .await?;
        if !answer.status.is_success() {
            return Err(RegistryError::status("GET", &answer));
        }
        let digest = sha256_digest(&answer.body);
        Ok((answer, digest))
    }

    /// The manifest `reference` (a digest or a tag) at `endpoint`. By digest, the bytes must
    /// have that digest.
    pub async fn manifest(
        &self,
        endpoint: &Endpoint,
        reference: &str,
        deadline: Duration,
    ) -> Result<Fetched, RegistryError> {
        let accept = MANIFEST_TYPES.join(", ");
        let build = |scheme: &str| {
            Request::get(endpoint.manifest_url(scheme, reference)).header(header::ACCEPT, &accept)
        };
        let (answer, digest) = self.pull(endpoint, build, MANIFEST, deadline).await?;
        if reference.starts_with("sha256:") && digest != reference {
            return Err(RegistryError::Answer {
                url: answer.url,
                why: format!("the manifest's digest is {digest}, not the one asked for"),
            });
        }
        Ok(Fetched {
            media_type: answer.header(header::CONTENT_TYPE).map(str::to_string),
            body: answer.body,
            digest,
        })
    }

    /// The blob `digest` of `endpoint`'s repository, within `limit`, its bytes checked.
    pub async fn blob(
        &self,
        endpoint: &Endpoint,
        digest: &str,
        limit: Limit,
        deadline: Duration,
    ) -> Result<Bytes, RegistryError> {
        let build = |scheme: &str| Request::get(endpoint.url(scheme, &format!("blobs/{digest}")));
        let (answer, actual) = self.pull(endpoint, build, limit, deadline).await?;
        if actual != digest {
            return Err(RegistryError::Answer {
                url: answer.url,
                why: format!("the registry served bytes of digest {actual}"),
            });
        }
        Ok(answer.body)
    }

    /// The blob `digest` of `endpoint`'s repository, `size` bytes as its descriptor says,
    /// streamed into `sink` as it arrives — never held whole. The bytes are counted against
    /// `size` (a registry sending more is cut there) and hashed; a digest that does not match is
    /// an error once the stream ends, so whatever `sink` made of them must not be used then.
    pub async fn blob_into(
        &self,
        endpoint: &Endpoint,
        digest: &str,
        size: u64,
        limit: Limit,
        deadline: Duration,
        sink: &mut dyn Sink,
    ) -> Result<(), RegistryError> {
        let mut checked = Checked {
            sink,
            hash: sha2::Sha256::new(),
            read: 0,
        };
        let mut last = None;
        for scheme in self.schemes(endpoint) {
            let request = Request::get(endpoint.url(scheme, &format!("blobs/{digest}")));
            let limit = limit.at_most(size.min(limit.max_bytes));
            match self
                .send(
                    endpoint,
                    request,
                    "pull",
                    limit,
                    deadline,
                    Some(&mut checked),
                )
                .await
            {
                // Another scheme, only when this one gave nothing to the sink.
                Err(RegistryError::Http(
                    e @ (HttpError::Unreachable { .. } | HttpError::PlainHttp { .. }),
                )) if checked.read == 0 => last = Some(RegistryError::Http(e)),
                Err(e) => return Err(e),
                Ok(answer) if !answer.status.is_success() => {
                    return Err(RegistryError::status("GET", &answer));
                }
                Ok(answer) => return checked.verify(digest, size, &answer.url),
            }
        }
        Err(last.expect("every endpoint has a scheme"))
    }

    /// Push `bytes` as a blob of `endpoint`'s repository (one upload: POST, then PUT); its
    /// digest.
    pub async fn push_blob(
        &self,
        endpoint: &Endpoint,
        bytes: Bytes,
        deadline: Duration,
    ) -> Result<String, RegistryError> {
        let digest = sha256_digest(&bytes);
        let start = |scheme: &str| Request {
            method: Method::POST,
            ..Request::get(endpoint.url(scheme, "blobs/uploads/"))
        };
        let started = self
            .on_endpoint(endpoint, start, "pull,push", UPLOAD_ANSWER, deadline)
            .await?;
        let started = expect(started, "POST", StatusCode::ACCEPTED)?;
        let location = started
            .header(header::LOCATION)
            .ok_or_else(|| RegistryError::Answer {
                url: started.url.clone(),
                why: "an upload without a Location".into(),
            })?;
        let url = crate::client::with_query(
            &absolute(&started.url, location),
            &[("digest", digest.as_str())],
        );
        let put = Request {
            method: Method::PUT,
            body: bytes,
            ..Request::get(url)
        }
        .header(header::CONTENT_TYPE, "application/octet-stream");
        let done = self
            .send(endpoint, put, "pull,push", UPLOAD_ANSWER, deadline, None)
            .await?;
        expect(done, "PUT", StatusCode::CREATED).map(|_| digest)
    }

    /// Push a manifest's bytes as `reference` (a tag or their digest); their digest.
    pub async fn push_manifest(
        &self,
        endpoint: &Endpoint,
        reference: &str,
        media_type: &str,
        bytes: Bytes,
        deadline: Duration,
    ) -> Result<String, RegistryError> {
        let digest = sha256_digest(&bytes);
        let put = |scheme: &str| {
            Request {
                method: Method::PUT,
                body: bytes.clone(),
                ..Request::get(endpoint.manifest_url(scheme, reference))
            }
            .header(header::CONTENT_TYPE, media_type)
        };
        let done = self
            .on_endpoint(endpoint, put, "pull,push", UPLOAD_ANSWER, deadline)
            .await?;
        expect(done, "PUT", StatusCode::CREATED).map(|_| digest)
    }
}

/// The answer to `method` when its status is `want`; else the error that names what came.
fn expect(answer: Answer, method: &str, want: StatusCode) -> Result<Answer, RegistryError> {
    if answer.status == want {
        Ok(answer)
    } else {
        Err(RegistryError::status(method, &answer))
    }
}

/// `location` made absolute against the URL that answered.
fn absolute(base: &str, location: &str) -> String {
    if location.contains("://") {
        location.to_string()
    } else {
        format!("{}{location}", crate::http::authority(base))
    }
}

/// A sink that counts and hashes what it passes on.
struct Checked<'a> {
    sink: &'a mut dyn Sink,
    hash: sha2::Sha256,
    read: u64,
}

impl Sink for Checked<'_> {
    fn take(&mut self, chunk: &[u8]) -> Result<(), String> {
        self.read += chunk.len() as u64;
        self.hash.update(chunk);
        self.sink.take(chunk)
    }
}

impl Checked<'_> {
    fn verify(self, digest: &str, size: u64, url: &str) -> Result<(), RegistryError> {
        let answer = |why: String| RegistryError::Answer {
            url: url.to_string(),
            why,
        };
        if self.read != size {
            return Err(answer(format!(
                "the blob is {} bytes, not the {size} of its descriptor",
                self.read
            )));
        }
        let actual = format!("sha256:{:x}", self.hash.finalize());
        if actual != digest {
            return Err(answer(format!(
                "the registry served bytes of digest {actual}"
            )));
        }
        Ok(())
    }
}
