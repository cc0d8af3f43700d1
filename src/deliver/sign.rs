//! Standard Webhooks signing (<https://www.standardwebhooks.com>). Pure.
//!
//! A signed delivery carries `webhook-id` (the message id), `webhook-timestamp` (Unix seconds)
//! and `webhook-signature`: `v1,<base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}"))>`, one
//! entry per configured secret, newest first, separated by spaces. During a rotation
//! (`secrets = [new, old]`) a receiver that knows either secret can verify.
//!
//! Secrets: `whsec_<base64>` (the spec's form) uses the base64-decoded bytes as the HMAC key.
//! A secret *without* that prefix uses its raw UTF-8 bytes. Note that the official libraries
//! base64-decode an unprefixed secret too; operators who share a secret with such a receiver
//! should give it in the `whsec_` form, which means the same key on both sides.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const HEADER_ID: &str = "webhook-id";
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
pub const HEADER_SIGNATURE: &str = "webhook-signature";
/// Marks a secret whose key is the base64 text that follows.
pub const SECRET_PREFIX: &str = "whsec_";

type HmacSha256 = Hmac<Sha256>;

/// Signs deliveries with one or more keys. Holds HMAC states already keyed (cloned per
/// signature), so a signature costs no key processing. Never prints the keys.
#[derive(Clone)]
pub struct Signer {
    /// Newest first, as configured.
    macs: Vec<HmacSha256>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signer {{ keys: {} }}", self.macs.len())
    }
}

impl Signer {
    /// Builds a signer from the configured secrets, newest first. Errors (an empty list, an
    /// empty secret, bad base64 after `whsec_`) name the entry by position, never its value.
    pub fn new(secrets: &[String]) -> Result<Signer, String> {
        if secrets.is_empty() {
            return Err("at least one secret is needed".into());
        }
        let which = |i: usize| {
            if secrets.len() == 1 {
                "secret".to_string()
            } else {
                format!("secret #{}", i + 1)
            }
        };
        let mut macs = Vec::with_capacity(secrets.len());
        for (i, secret) in secrets.iter().enumerate() {
            let key = match secret.strip_prefix(SECRET_PREFIX) {
                Some(b64) => STANDARD.decode(b64).map_err(|_| {
                    format!("{}: not valid base64 after \"{SECRET_PREFIX}\"", which(i))
                })?,
                None => secret.as_bytes().to_vec(),
            };
            if key.is_empty() {
                return Err(format!("{}: empty", which(i)));
            }
            // HMAC takes keys of any length; the error branch is unreachable but not unwrapped.
            let mac = HmacSha256::new_from_slice(&key)
                .map_err(|e| format!("{}: unusable key: {e}", which(i)))?;
            macs.push(mac);
        }
        Ok(Signer { macs })
    }

    /// The `webhook-signature` value for this message: `v1,<sig>` per key, space-separated.
    pub fn signature_header(&self, msg_id: &str, timestamp_s: u64, body: &[u8]) -> String {
        let prefix = format!("{msg_id}.{timestamp_s}.");
        let mut out = String::with_capacity(self.macs.len() * 48);
        for (i, keyed) in self.macs.iter().enumerate() {
            let mut mac = keyed.clone();
            mac.update(prefix.as_bytes());
            mac.update(body);
            if i > 0 {
                out.push(' ');
            }
            out.push_str("v1,");
            STANDARD.encode_string(mac.finalize().into_bytes(), &mut out);
        }
        out
    }
}

/// DingTalk robot signing: `sign = base64(HMAC-SHA256(key = secret, "{timestamp_ms}\n{secret}"))`,
/// sent as the `timestamp` and (URL-encoded) `sign` query parameters.
pub fn dingtalk_sign(secret: &str, timestamp_ms: u64) -> String {
    // HMAC takes keys of any length: `new_from_slice` cannot fail; no unwrap all the same.
    let Ok(mut mac) = HmacSha256::new_from_slice(secret.as_bytes()) else {
        return String::new();
    };
    mac.update(format!("{timestamp_ms}\n{secret}").as_bytes());
    STANDARD.encode(mac.finalize().into_bytes())
}

/// Feishu/Lark bot signing: `sign = base64(HMAC-SHA256(key = "{timestamp_s}\n{secret}", ""))`
/// (the string is the key and the message is empty, as Feishu documents it), sent in the JSON
/// body as `timestamp` (a string of Unix seconds) and `sign`.
pub fn feishu_sign(secret: &str, timestamp_s: u64) -> String {
    let Ok(mac) = HmacSha256::new_from_slice(format!("{timestamp_s}\n{secret}").as_bytes()) else {
        return String::new();
    };
    STANDARD.encode(mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;

    /// HMAC-SHA256 from RFC 2104 directly on `sha2`, independent of the `hmac` crate.
    fn reference_hmac(key: &[u8], msg: &[u8]) -> [u8; 32] {
        let mut k = [0u8; 64];
        if key.len() > 64 {
            k[..32].copy_from_slice(&Sha256::digest(key));
        } else {
            k[..key.len()].copy_from_slice(key);
        }
        let pad = |byte: u8| k.map(|b| b ^ byte);
        let inner = Sha256::new()
            .chain_update(pad(0x36))
            .chain_update(msg)
            .finalize();
        Sha256::new()
            .chain_update(pad(0x5c))
            .chain_update(inner)
            .finalize()
            .into()
    }

    #[test]
    fn standard_webhooks_test_vector() {
        // The official vector, from standard-webhooks/standard-webhooks:
        // libraries/python/tests/test_webhooks.py `test_sign_function` (the same values are in
        // libraries/javascript/src/webhook.test.ts, "sign function works").
        let signer = Signer::new(&["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()]).unwrap();
        assert_eq!(
            signer.signature_header(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn rotation_signs_with_every_secret_newest_first() {
        let new = "whsec_".to_string() + &STANDARD.encode(b"the new key, 32 bytes long......");
        let old = "plain old secret".to_string();
        let signer = Signer::new(&[new, old]).unwrap();
        let (id, ts, body) = ("task-1:3:7", 1_800_000_000, br#"{"to":"a","body":"hi"}"#);
        let header = signer.signature_header(id, ts, body);

        let signed = format!("{id}.{ts}.").into_bytes();
        let signed = [signed.as_slice(), body.as_slice()].concat();
        let expect: Vec<String> = [
            &b"the new key, 32 bytes long......"[..],
            &b"plain old secret"[..],
        ]
        .iter()
        .map(|key| format!("v1,{}", STANDARD.encode(reference_hmac(key, &signed))))
        .collect();
        assert_eq!(header.split(' ').collect::<Vec<_>>(), expect);
        // Each entry depends on its key alone: the old secret by itself gives the second entry.
        let old_only = Signer::new(&["plain old secret".into()]).unwrap();
        assert_eq!(old_only.signature_header(id, ts, body), expect[1]);
        // The independent HMAC agrees with the official vector as well.
        let key = STANDARD.decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let vector = br#"msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330.{"test": 2432232314}"#;
        assert_eq!(
            STANDARD.encode(reference_hmac(&key, vector)),
            "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn bad_secrets_are_refused_without_echoing_them() {
        assert_eq!(
            Signer::new(&[]).unwrap_err(),
            "at least one secret is needed"
        );
        assert_eq!(Signer::new(&["".into()]).unwrap_err(), "secret: empty");
        assert_eq!(
            Signer::new(&["whsec_".into()]).unwrap_err(),
            "secret: empty"
        );
        let e = Signer::new(&["whsec_abc".into(), "whsec_not*base64!".into()]).unwrap_err();
        assert_eq!(e, "secret #1: not valid base64 after \"whsec_\"");
        let e = Signer::new(&["ok".into(), "whsec_not*base64!".into()]).unwrap_err();
        assert_eq!(e, "secret #2: not valid base64 after \"whsec_\"");
        let s = Signer::new(&["ok".into(), "also ok".into()]).unwrap();
        assert_eq!(format!("{s:?}"), "Signer { keys: 2 }");
    }
}
