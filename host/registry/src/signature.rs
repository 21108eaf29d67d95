//! Cosign signatures of artifacts, keyed (ECDSA P-256), in cosign's format for OCI registries
//! (its `SIGNATURE_SPEC`): the signature of `REPO@sha256:HEX` is an image manifest tagged
//! `sha256-HEX.sig` in the same repository, one layer per signature: a simple-signing payload
//! (`application/vnd.dev.cosign.simplesigning.v1+json`) naming the signed manifest's digest, the
//! base64 ASN.1 signature of the payload in the layer's `dev.cosignproject.cosign/signature`
//! annotation. Keys are cosign's: `cosign.pub` a PEM `PUBLIC KEY`, `cosign.key` a PEM
//! `ENCRYPTED SIGSTORE PRIVATE KEY` (scrypt + NaCl secretbox around PKCS#8, the password in
//! `COSIGN_PASSWORD`). Verification needs the registry only: no transparency log, so it works
//! on a disconnected site.

use crate::artifact::{
    ArtifactError, ArtifactRef, Artifacts, Descriptor, manifest_json, sha256_digest,
};
use crate::limits::SIGNATURE_PAYLOAD;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ring::signature::{self as sig, KeyPair};

pub const PAYLOAD_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
const SIGNATURE_TYPE: &str = "cosign container image signature";
const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
/// The DER prefix of a P-256 SubjectPublicKeyInfo: the algorithm (id-ecPublicKey, prime256v1)
/// and the BIT STRING header of the 65-byte uncompressed point that follows it.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];
/// Signatures of one artifact read before giving up (each is a request to the registry).
const MAX_SIGNATURES: usize = 32;
/// cosign's scrypt cost for new keys.
const SCRYPT_LOG_N: u8 = 15;
const PRIVATE_PEM: &str = "ENCRYPTED SIGSTORE PRIVATE KEY";
/// The label cosign before 2.0 wrote; the same contents.
const OLD_PRIVATE_PEM: &str = "ENCRYPTED COSIGN PRIVATE KEY";

#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    #[error("{0}")]
    Key(String),
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error("{reference}: no cosign signature (nothing at tag {tag})")]
    Unsigned { reference: String, tag: String },
    #[error("{reference}: no signature verifies with the trusted key(s): {}", reasons.join("; "))]
    Refused {
        reference: String,
        reasons: Vec<String>,
    },
}

impl SignatureError {
    /// The kind of refusal this is, for a module.
    pub fn refusal(&self) -> pinset_core::refusal::Refusal {
        use pinset_core::refusal::Refusal;
        match self {
            SignatureError::Artifact(e) => e.refusal(),
            SignatureError::Unsigned { .. } => Refusal::Unsigned,
            SignatureError::Refused { .. } | SignatureError::Key(_) => Refusal::SignatureRefused,
        }
    }
}

/// A public key signatures are checked with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyingKey {
    point: Vec<u8>,
}

impl VerifyingKey {
    /// A PEM `PUBLIC KEY` (SubjectPublicKeyInfo) of a P-256 key, as `cosign.pub` holds it.
    pub fn from_pem(text: &str) -> Result<Self, SignatureError> {
        let der = pem_block(text, &["PUBLIC KEY"])?.1;
        let point = der
            .strip_prefix(&P256_SPKI_PREFIX[..])
            .filter(|p| p.len() == 65 && p[0] == 4)
            .ok_or_else(|| SignatureError::Key("not an ECDSA P-256 public key".into()))?;
        Ok(Self {
            point: point.to_vec(),
        })
    }

    pub fn to_pem(&self) -> String {
        pem("PUBLIC KEY", &[&P256_SPKI_PREFIX[..], &self.point].concat())
    }

    /// `sha256:<hex>` of the key's DER: how a record names the key that verified a module.
    pub fn fingerprint(&self) -> String {
        sha256_digest(&[&P256_SPKI_PREFIX[..], &self.point].concat())
    }

    fn verifies(&self, payload: &[u8], signature: &[u8]) -> bool {
        sig::UnparsedPublicKey::new(&sig::ECDSA_P256_SHA256_ASN1, &self.point)
            .verify(payload, signature)
            .is_ok()
    }
}

/// A private key signatures are made with.
pub struct SigningKey {
    pair: sig::EcdsaKeyPair,
}

impl SigningKey {
    /// cosign's `cosign.key` (encrypted with `password`), or an unencrypted PKCS#8 `PRIVATE KEY`.
    pub fn from_pem(text: &str, password: &[u8]) -> Result<Self, SignatureError> {
        let (label, der) = pem_block(text, &[PRIVATE_PEM, OLD_PRIVATE_PEM, "PRIVATE KEY"])?;
        let pkcs8 = match label.as_str() {
            "PRIVATE KEY" => der,
            _ => decrypt(&der, password)?,
        };
        let pair = sig::EcdsaKeyPair::from_pkcs8(
            &sig::ECDSA_P256_SHA256_ASN1_SIGNING,
            &pkcs8,
            &ring::rand::SystemRandom::new(),
        )
        .map_err(|e| SignatureError::Key(format!("not an ECDSA P-256 private key: {e}")))?;
        Ok(Self { pair })
    }

    /// A new key pair in cosign's formats: (`cosign.key` encrypted with `password`, the key).
    pub fn generate(password: &[u8]) -> Result<(String, Self), SignatureError> {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = sig::EcdsaKeyPair::generate_pkcs8(&sig::ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
            .map_err(|_| SignatureError::Key("cannot generate a key".into()))?;
        let pem = pem(
            PRIVATE_PEM,
            &encrypt(pkcs8.as_ref(), password, SCRYPT_LOG_N)?,
        );
        let key = Self::from_pem(&pem, password)?;
        Ok((pem, key))
    }

    pub fn public(&self) -> VerifyingKey {
        VerifyingKey {
            point: self.pair.public_key().as_ref().to_vec(),
        }
    }

    fn sign(&self, payload: &[u8]) -> Result<Vec<u8>, SignatureError> {
        self.pair
            .sign(&ring::rand::SystemRandom::new(), payload)
            .map(|s| s.as_ref().to_vec())
            .map_err(|_| SignatureError::Key("signing failed".into()))
    }
}

/// The tag a signature of `digest` lives at: `sha256-HEX.sig`.
pub fn signature_tag(digest: &str) -> String {
    format!("{}.sig", digest.replace(':', "-"))
}

/// The simple-signing payload for `at` (pinned).
pub fn payload(at: &ArtifactRef, digest: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "critical": {
            "identity": {"docker-reference": at.name()},
            "image": {"docker-manifest-digest": digest},
            "type": SIGNATURE_TYPE,
        },
        "optional": null,
    }))
    .expect("a payload serialises")
}

/// A signature that verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// [`VerifyingKey::fingerprint`] of the key.
    pub key: String,
}

impl Artifacts {
    /// Sign the artifact `reference` names (a tag is resolved to its digest first) and push the
    /// signature beside it; the signature's reference. Signatures already there are kept.
    pub async fn sign(
        &self,
        reference: &ArtifactRef,
        key: &SigningKey,
    ) -> Result<ArtifactRef, SignatureError> {
        let at = self.resolve(reference).await?;
        let digest = at.pinned()?.to_string();
        let tag = at.tagged(&signature_tag(&digest));
        let payload = payload(&at, &digest);
        let signature = B64.encode(key.sign(&payload)?);
        self.push_blob(&tag, payload.clone()).await?;
        let mut layers = match self.manifest(&tag).await? {
            Some((manifest, _)) => manifest.layers,
            None => Vec::new(),
        };
        layers.push(
            Descriptor::of(PAYLOAD_MEDIA_TYPE, &payload)
                .annotated(SIGNATURE_ANNOTATION, &signature),
        );
        let config = signature_config(&layers);
        self.push_blob(&tag, config.clone()).await?;
        let manifest = manifest_json(&Descriptor::of(CONFIG_MEDIA_TYPE, &config), &layers);
        self.push_manifest(&tag, manifest).await?;
        Ok(tag)
    }

    /// The first signature of `reference` (pinned) that one of `keys` verifies.
    pub async fn verify(
        &self,
        reference: &ArtifactRef,
        keys: &[VerifyingKey],
    ) -> Result<Verified, SignatureError> {
        let digest = reference.pinned()?.to_string();
        let tag = reference.tagged(&signature_tag(&digest));
        let Some((manifest, _)) = self.manifest(&tag).await? else {
            // No signature: first, is there anything at that digest to sign?
            if self.manifest(reference).await?.is_none() {
                return Err(ArtifactError::NotFound {
                    reference: reference.to_string(),
                }
                .into());
            }
            return Err(SignatureError::Unsigned {
                reference: reference.to_string(),
                tag: tag.to_string(),
            });
        };
        let mut reasons = Vec::new();
        // A registry names how many signatures there are: only so many are read.
        for (n, layer) in manifest.layers.iter().take(MAX_SIGNATURES).enumerate() {
            if layer.media_type != PAYLOAD_MEDIA_TYPE {
                continue;
            }
            let payload = self.blob(&tag, &layer.digest, SIGNATURE_PAYLOAD).await?;
            match check(&payload, layer, &digest, keys) {
                Ok(verified) => return Ok(verified),
                Err(why) => reasons.push(format!("signature {}: {why}", n + 1)),
            }
        }
        if reasons.is_empty() {
            reasons.push(format!("{tag} holds no cosign signature layer"));
        }
        Err(SignatureError::Refused {
            reference: reference.to_string(),
            reasons,
        })
    }
}

/// One signature layer against the digest it must sign and the trusted keys.
fn check(
    payload: &[u8],
    layer: &Descriptor,
    digest: &str,
    keys: &[VerifyingKey],
) -> Result<Verified, String> {
    let signature = layer
        .annotations
        .as_ref()
        .and_then(|a| a.get(SIGNATURE_ANNOTATION))
        .ok_or("no signature annotation")?;
    let signature = B64
        .decode(signature.trim())
        .map_err(|e| format!("the signature is not base64: {e}"))?;
    let signed = signed_digest(payload)?;
    if signed != digest {
        return Err(format!("it signs {signed}, not this digest"));
    }
    keys.iter()
        .find(|k| k.verifies(payload, &signature))
        .map(|k| Verified {
            key: k.fingerprint(),
        })
        .ok_or_else(|| "signed by another key, or corrupted".to_string())
}

/// The digest a simple-signing payload names, once its type is cosign's.
fn signed_digest(payload: &[u8]) -> Result<String, String> {
    let value: serde_json::Value =
        serde_json::from_slice(payload).map_err(|e| format!("the payload is not JSON: {e}"))?;
    let critical = value
        .get("critical")
        .ok_or("the payload has no critical section")?;
    if critical.get("type").and_then(|t| t.as_str()) != Some(SIGNATURE_TYPE) {
        return Err(format!("the payload's type is not {SIGNATURE_TYPE:?}"));
    }
    // Early cosign wrote `Docker-manifest-digest`: keys are compared without case.
    critical
        .get("image")
        .and_then(|i| i.as_object())
        .and_then(|i| {
            i.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("docker-manifest-digest"))
        })
        .and_then(|(_, v)| v.as_str())
        .map(str::to_string)
        .ok_or_else(|| "the payload names no manifest digest".into())
}

/// The config of a signature image, as cosign writes it: the payloads as the rootfs.
fn signature_config(layers: &[Descriptor]) -> Vec<u8> {
    let epoch = "0001-01-01T00:00:00Z";
    serde_json::to_vec(&serde_json::json!({
        "architecture": "",
        "created": epoch,
        "history": layers.iter().map(|_| serde_json::json!({"created": epoch})).collect::<Vec<_>>(),
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.digest.clone()).collect::<Vec<_>>()},
        "config": {},
    }))
    .expect("a config serialises")
}

/// The encrypted private key's envelope (secure-systems-lab's format, which cosign uses).
#[derive(serde::Serialize, serde::Deserialize)]
struct Envelope {
    kdf: Kdf,
    cipher: Cipher,
    ciphertext: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Kdf {
    name: String,
    params: KdfParams,
    salt: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct KdfParams {
    #[serde(rename = "N")]
    n: u64,
    r: u32,
    p: u32,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Cipher {
    name: String,
    nonce: String,
}

fn secretbox_key(password: &[u8], salt: &[u8], p: &KdfParams) -> Result<[u8; 32], SignatureError> {
    let bad =
        |why: String| SignatureError::Key(format!("the private key's scrypt parameters: {why}"));
    // Bounded: a key file names the memory (128 × r × N bytes) and time its reading costs;
    // cosign writes N = 2^15, r = 8, p = 1 (32 MiB).
    if !p.n.is_power_of_two() || p.n < 2 || p.n > 1 << 16 || p.r > 16 || p.p > 4 {
        return Err(bad(format!(
            "N = {}, r = {}, p = {} (at most N = 2^16, r = 16, p = 4)",
            p.n, p.r, p.p
        )));
    }
    let params = scrypt::Params::new(p.n.trailing_zeros() as u8, p.r, p.p, 32)
        .map_err(|e| bad(e.to_string()))?;
    let mut key = [0u8; 32];
    scrypt::scrypt(password, salt, &params, &mut key).map_err(|e| bad(e.to_string()))?;
    Ok(key)
}

fn decrypt(envelope: &[u8], password: &[u8]) -> Result<Vec<u8>, SignatureError> {
    use crypto_secretbox::aead::{Aead, KeyInit};
    let bad = |why: &str| SignatureError::Key(format!("not a cosign private key: {why}"));
    let e: Envelope =
        serde_json::from_slice(envelope).map_err(|_| bad("the envelope is not JSON"))?;
    if e.kdf.name != "scrypt" || e.cipher.name != "nacl/secretbox" {
        return Err(bad("only scrypt with nacl/secretbox is read"));
    }
    let decode = |s: &str| B64.decode(s).map_err(|_| bad("a field is not base64"));
    let (salt, nonce, ciphertext) = (
        decode(&e.kdf.salt)?,
        decode(&e.cipher.nonce)?,
        decode(&e.ciphertext)?,
    );
    if nonce.len() != 24 {
        return Err(bad("the nonce is not 24 bytes"));
    }
    let key = secretbox_key(password, &salt, &e.kdf.params)?;
    crypto_secretbox::XSalsa20Poly1305::new(&key.into())
        .decrypt(nonce.as_slice().into(), ciphertext.as_slice())
        .map_err(|_| {
            SignatureError::Key(
                "cannot decrypt the private key: wrong password (COSIGN_PASSWORD)?".into(),
            )
        })
}

fn encrypt(plain: &[u8], password: &[u8], log_n: u8) -> Result<Vec<u8>, SignatureError> {
    use crypto_secretbox::aead::{Aead, KeyInit};
    use ring::rand::SecureRandom;
    let rng = ring::rand::SystemRandom::new();
    let (mut salt, mut nonce) = ([0u8; 32], [0u8; 24]);
    rng.fill(&mut salt)
        .and_then(|()| rng.fill(&mut nonce))
        .map_err(|_| SignatureError::Key("no randomness".into()))?;
    let params = KdfParams {
        n: 1 << log_n,
        r: 8,
        p: 1,
    };
    let key = secretbox_key(password, &salt, &params)?;
    let ciphertext = crypto_secretbox::XSalsa20Poly1305::new(&key.into())
        .encrypt(&nonce.into(), plain)
        .map_err(|_| SignatureError::Key("cannot encrypt the key".into()))?;
    let envelope = Envelope {
        kdf: Kdf {
            name: "scrypt".into(),
            params,
            salt: B64.encode(salt),
        },
        cipher: Cipher {
            name: "nacl/secretbox".into(),
            nonce: B64.encode(nonce),
        },
        ciphertext: B64.encode(ciphertext),
    };
    Ok(serde_json::to_vec(&envelope).expect("an envelope serialises"))
}

/// The first PEM block with one of `labels`: (label, bytes).
fn pem_block(text: &str, labels: &[&str]) -> Result<(String, Vec<u8>), SignatureError> {
    for label in labels {
        let begin = format!("-----BEGIN {label}-----");
        let Some(start) = text.find(&begin) else {
            continue;
        };
        let body = &text[start + begin.len()..];
        let end = body
            .find(&format!("-----END {label}-----"))
            .ok_or_else(|| SignatureError::Key(format!("PEM {label}: no END line")))?;
        let b64: String = body[..end].split_whitespace().collect();
        let der = B64
            .decode(b64)
            .map_err(|e| SignatureError::Key(format!("PEM {label}: not base64: {e}")))?;
        return Ok((label.to_string(), der));
    }
    Err(SignatureError::Key(format!(
        "no PEM block of {}",
        labels.join(" or ")
    )))
}

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = B64.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).expect("base64 is ASCII"))
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(signature: &str) -> Descriptor {
        Descriptor {
            media_type: PAYLOAD_MEDIA_TYPE.into(),
            digest: "sha256:0".into(),
            size: 0,
            annotations: Some([(SIGNATURE_ANNOTATION.to_string(), signature.to_string())].into()),
            platform: None,
        }
    }

    #[test]
    fn a_generated_key_reads_back_and_signs_what_its_public_key_verifies() {
        let (pem, key) = SigningKey::generate(b"pw").unwrap();
        assert!(
            pem.starts_with("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n"),
            "{pem}"
        );
        let again = SigningKey::from_pem(&pem, b"pw").unwrap();
        assert_eq!(again.public(), key.public());
        let e = SigningKey::from_pem(&pem, b"wrong")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("wrong password"), "{e}");
        let public = VerifyingKey::from_pem(&key.public().to_pem()).unwrap();
        assert_eq!(public, key.public());

        let at = ArtifactRef::parse(&format!("r.io/p@sha256:{}", "a".repeat(64))).unwrap();
        let digest = at.digest().unwrap();
        let payload = payload(&at, digest);
        let signature = B64.encode(key.sign(&payload).unwrap());
        let ok = check(
            &payload,
            &layer(&signature),
            digest,
            std::slice::from_ref(&public),
        )
        .unwrap();
        assert_eq!(ok.key, public.fingerprint());

        let other = SigningKey::generate(b"").unwrap().1.public();
        let e = check(&payload, &layer(&signature), digest, &[other]).unwrap_err();
        assert!(e.contains("another key"), "{e}");
        let e = check(
            &payload,
            &layer(&signature),
            &format!("sha256:{}", "b".repeat(64)),
            std::slice::from_ref(&public),
        )
        .unwrap_err();
        assert!(e.contains("not this digest"), "{e}");
        let e = check(&payload, &layer("!!"), digest, &[public]).unwrap_err();
        assert!(e.contains("not base64"), "{e}");
    }

    #[test]
    fn keys_that_are_not_p256_or_not_pem_are_refused_by_name() {
        let e = VerifyingKey::from_pem("hello").unwrap_err().to_string();
        assert!(e.contains("PUBLIC KEY"), "{e}");
        let ed25519 = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n";
        let e = VerifyingKey::from_pem(ed25519).unwrap_err().to_string();
        assert!(e.contains("P-256"), "{e}");
    }

    #[test]
    fn a_key_asking_for_unbounded_work_is_refused_before_any() {
        let (pem_text, _) = SigningKey::generate(b"pw").unwrap();
        let der = pem_block(&pem_text, &[PRIVATE_PEM]).unwrap().1;
        let mut envelope: Envelope = serde_json::from_slice(&der).unwrap();
        envelope.kdf.params.n = 1 << 30;
        let hostile = pem(PRIVATE_PEM, &serde_json::to_vec(&envelope).unwrap());
        let e = SigningKey::from_pem(&hostile, b"pw")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("at most N = 2^16"), "{e}");
    }

    #[test]
    fn the_signature_tag_is_cosigns() {
        assert_eq!(signature_tag("sha256:abc"), "sha256-abc.sig");
    }
}
