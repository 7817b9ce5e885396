//! `serve --http` as an OAuth 2.1 resource server, as the MCP authorization spec asks.
//!
//! With `SANDBOX_OAUTH_ISSUER`, `SANDBOX_OAUTH_JWKS` and `SANDBOX_HTTP_RESOURCE_URL` set, a
//! request may carry a JWT access token from that issuer instead of a token of the tokens file:
//!
//! - the signature is checked with the issuer's key the token names (`kid`), from the JWKS
//!   (a file read at start, or a URL fetched at start and again, at most once a minute, when a
//!   token names a key it does not hold); RSA, EC (P-256, P-384) and Ed25519 keys, each only
//!   for its own algorithms; `alg: none` and HMAC are refused;
//! - `iss` must be the issuer, `aud` must name the resource URL, `exp` must be ahead and `nbf`
//!   (when present) behind, both within [`LEEWAY_SECONDS`]; `sub` is required;
//! - the scopes (`scope`, space-separated, or an `scp` array) must include [`SCOPE_RUN`];
//!   [`SCOPE_ADMIN`] makes the caller an admin. The caller is the principal `oauth:` + `sub`,
//!   with the quotas of an optional `sandbox_quotas` claim.
//!
//! Refusals carry the challenge RFC 6750 and RFC 9728 describe: 401 with `WWW-Authenticate:
//! Bearer resource_metadata="…", scope="sandbox:run"` (and `error="invalid_token"` when a token
//! was presented), 403 with `error="insufficient_scope"`. The Protected Resource Metadata
//! ([`OAuth::metadata`]) is served, without authentication, at [`METADATA_PATH`] and at the
//! path-suffixed form for the resource's path.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use super::principals::{Principal, QuotaOverrides};
use crate::config::{Config, JwksSource};

/// The scope every request needs.
pub const SCOPE_RUN: &str = "sandbox:run";
/// The scope of an admin (sees and reaches every principal's sessions).
pub const SCOPE_ADMIN: &str = "sandbox:admin";
/// Where the Protected Resource Metadata is served (RFC 9728), also with the resource's path
/// after it.
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";
/// The clock skew allowed on `exp` and `nbf`.
pub const LEEWAY_SECONDS: u64 = 30;
/// A JWKS is fetched again, for a key it does not hold, at most this often.
const REFETCH_INTERVAL: Duration = Duration::from_secs(60);
/// How long fetching the JWKS may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest JWKS read.
const MAX_JWKS_BYTES: u64 = 1 << 20;

/// Why a request's access token was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OAuthRefusal {
    /// No valid token (bad signature, expired, another audience, ...): 401, `invalid_token`.
    InvalidToken(String),
    /// A valid token without the scope needed: 403, `insufficient_scope`.
    InsufficientScope(String),
}

impl OAuthRefusal {
    pub fn status(&self) -> StatusCode {
        match self {
            OAuthRefusal::InvalidToken(_) => StatusCode::UNAUTHORIZED,
            OAuthRefusal::InsufficientScope(_) => StatusCode::FORBIDDEN,
        }
    }

    /// The OAuth error code (RFC 6750, section 3.1).
    pub fn error(&self) -> &'static str {
        match self {
            OAuthRefusal::InvalidToken(_) => "invalid_token",
            OAuthRefusal::InsufficientScope(_) => "insufficient_scope",
        }
    }

    /// What is wrong, for people.
    pub fn description(&self) -> &str {
        match self {
            OAuthRefusal::InvalidToken(text) | OAuthRefusal::InsufficientScope(text) => text,
        }
    }
}

impl std::fmt::Display for OAuthRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.error(), self.description())
    }
}

/// The resource server: the issuer's keys and what a token must say.
#[derive(Debug)]
pub struct OAuth {
    issuer: String,
    resource: String,
    metadata_url: String,
    /// The resource URL's path (`/mcp`), or empty.
    resource_path: String,
    source: JwksSource,
    keys: RwLock<Arc<KeySet>>,
    /// When the JWKS was last loaded; held while a load is under way.
    loaded: tokio::sync::Mutex<Instant>,
    http: reqwest::Client,
}

impl OAuth {
    /// The resource server the configuration asks for (`None` when OAuth is off), with the
    /// JWKS loaded. An error says what to fix: a JWKS that cannot be read or fetched, or holds
    /// no key this server can verify with.
    pub async fn from_config(config: &Config) -> Result<Option<OAuth>, String> {
        let policy = &config.http.oauth;
        let (Some(issuer), Some(source), Some(resource)) =
            (&policy.issuer, &policy.jwks, &policy.resource_url)
        else {
            return Ok(None);
        };
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::custom(|attempt| {
                // Never from https to http: the keys decide who may run code.
                if attempt.previous().len() >= 5 || attempt.url().scheme() != "https" {
                    attempt.stop()
                } else {
                    attempt.follow()
                }
            }))
            .build()
            .map_err(|e| format!("SANDBOX_OAUTH_JWKS: cannot make an HTTP client: {e}"))?;
        let keys = load(&http, source).await?;
        tracing::info!(
            issuer = %issuer,
            keys = keys.keys.len(),
            "OAuth: accepting access tokens for {resource}"
        );
        let (metadata_url, resource_path) = metadata_url(resource)?;
        Ok(Some(OAuth {
            issuer: issuer.clone(),
            resource: resource.clone(),
            metadata_url,
            resource_path,
            source: source.clone(),
            keys: RwLock::new(Arc::new(keys)),
            loaded: tokio::sync::Mutex::new(Instant::now()),
            http,
        }))
    }

    /// The principal a bearer token stands for, when it is a valid access token with the
    /// scope [`SCOPE_RUN`].
    pub async fn identify(&self, token: &str) -> Result<Principal, OAuthRefusal> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| {
            OAuthRefusal::InvalidToken(format!(
                "not a signed JWT access token ({e}); tokens signed with alg none are refused"
            ))
        })?;
        if header.alg.family() == jsonwebtoken::AlgorithmFamily::Hmac {
            return Err(invalid(format!(
                "{:?} (a shared secret) is refused: the issuer must sign with RSA, EC or Ed25519",
                header.alg
            )));
        }
        let kid = header.kid.as_deref();
        let mut keys = self.current_keys();
        if kid.is_some_and(|kid| !keys.has(kid)) && self.reload_if_due().await {
            keys = self.current_keys();
        }
        let candidates = keys.candidates(kid);
        if candidates.is_empty() {
            return Err(invalid(match kid {
                Some(kid) => {
                    format!("signed with a key the issuer's JWKS does not hold (kid `{kid}`)")
                }
                None => "the token names no key (kid) and the JWKS holds several".to_string(),
            }));
        }
        let mut refusal = None;
        for key in candidates {
            if !key.algorithms.contains(&header.alg) {
                refusal = Some(invalid(format!(
                    "the key{} is not for {:?}",
                    key.kid
                        .as_deref()
                        .map(|k| format!(" `{k}`"))
                        .unwrap_or_default(),
                    header.alg
                )));
                continue;
            }
            match jsonwebtoken::decode::<Claims>(token, &key.decoding, &self.validation(header.alg))
            {
                Ok(data) => return self.principal(data.claims),
                Err(e) => refusal = Some(invalid(self.explain(e))),
            }
        }
        Err(refusal.unwrap_or_else(|| invalid("no key of the JWKS verifies this token".into())))
    }

    /// The `WWW-Authenticate` challenge of a refusal; `None`: no token was presented.
    pub fn challenge(&self, refusal: Option<&OAuthRefusal>) -> String {
        let mut parts = Vec::new();
        if let Some(refusal) = refusal {
            parts.push(format!("error=\"{}\"", refusal.error()));
            parts.push(format!(
                "error_description=\"{}\"",
                quotable(refusal.description())
            ));
        }
        parts.push(format!("resource_metadata=\"{}\"", self.metadata_url));
        parts.push(format!("scope=\"{SCOPE_RUN}\""));
        format!("Bearer {}", parts.join(", "))
    }

    /// The Protected Resource Metadata (RFC 9728).
    pub fn metadata(&self) -> serde_json::Value {
        serde_json::json!({
            "resource": self.resource,
            "authorization_servers": [self.issuer],
            "scopes_supported": [SCOPE_RUN, SCOPE_ADMIN],
            "bearer_methods_supported": ["header"],
        })
    }

    /// The issuer whose tokens are accepted.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Where clients find the metadata: the URL `resource_metadata` names.
    pub fn metadata_url(&self) -> &str {
        &self.metadata_url
    }

    /// Whether a request path is one the metadata is served at: [`METADATA_PATH`], alone or
    /// followed by the resource URL's path or the server's own MCP path.
    pub fn is_metadata_path(&self, path: &str) -> bool {
        path.strip_prefix(METADATA_PATH).is_some_and(|rest| {
            rest.is_empty() || rest == super::http::MCP_PATH || rest == self.resource_path
        })
    }

    fn current_keys(&self) -> Arc<KeySet> {
        match self.keys.read() {
            Ok(keys) => keys.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Loads the JWKS again unless that was done within [`REFETCH_INTERVAL`]; `true` when the
    /// keys were replaced. A load that fails keeps the keys in force.
    async fn reload_if_due(&self) -> bool {
        let mut loaded = self.loaded.lock().await;
        if loaded.elapsed() < REFETCH_INTERVAL {
            return false;
        }
        *loaded = Instant::now();
        match load(&self.http, &self.source).await {
            Ok(keys) => {
                tracing::info!(
                    keys = keys.keys.len(),
                    "OAuth: loaded the issuer's JWKS again"
                );
                match self.keys.write() {
                    Ok(mut slot) => *slot = Arc::new(keys),
                    Err(poisoned) => *poisoned.into_inner() = Arc::new(keys),
                }
                true
            }
            Err(e) => {
                tracing::warn!("OAuth: {e}; the keys loaded before stay in force");
                false
            }
        }
    }

    fn validation(&self, alg: Algorithm) -> Validation {
        let mut validation = Validation::new(alg);
        validation.leeway = LEEWAY_SECONDS;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.validate_aud = true;
        validation.set_audience(&[&self.resource]);
        validation.set_issuer(&[&self.issuer]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation
    }

    fn explain(&self, error: jsonwebtoken::errors::Error) -> String {
        use jsonwebtoken::errors::ErrorKind;
        match error.kind() {
            ErrorKind::InvalidSignature => "the signature does not verify".to_string(),
            ErrorKind::ExpiredSignature => "the token has expired".to_string(),
            ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)".to_string(),
            ErrorKind::InvalidAudience => format!(
                "the token is not for this server: its aud must include {}",
                self.resource
            ),
            ErrorKind::InvalidIssuer => {
                format!(
                    "the token is from another issuer: iss must be {}",
                    self.issuer
                )
            }
            ErrorKind::MissingRequiredClaim(claim) => format!("the token has no {claim} claim"),
            ErrorKind::InvalidClaimFormat(claim) => {
                format!("the token's {claim} claim is malformed")
            }
            ErrorKind::Json(e) => format!("the token's claims are malformed: {e}"),
            _ => format!("the token is invalid ({error})"),
        }
    }

    fn principal(&self, claims: Claims) -> Result<Principal, OAuthRefusal> {
        let sub = claims.sub.clone().unwrap_or_default();
        if sub.trim().is_empty() {
            return Err(invalid("the token's sub claim is empty".into()));
        }
        let scopes = claims.scopes();
        let admin = scopes.contains(SCOPE_ADMIN);
        if !scopes.contains(SCOPE_RUN) {
            return Err(OAuthRefusal::InsufficientScope(format!(
                "the token lacks the scope {SCOPE_RUN}"
            )));
        }
        let quotas = claims.sandbox_quotas.unwrap_or_default();
        Ok(Principal {
            name: format!("oauth:{sub}"),
            admin,
            quotas: QuotaOverrides {
                sessions: quotas
                    .sessions
                    .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
                executions: quotas
                    .executions
                    .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
                cpu_seconds_per_day: quotas.cpu_seconds_per_day,
            },
            roots_map: Vec::new(),
            secrets: Default::default(),
        })
    }
}

/// The routes of the Protected Resource Metadata: public (outside the token gate, as RFC 9728
/// and the MCP spec have it), readable from any browser origin.
pub fn routes(oauth: Arc<OAuth>) -> axum::Router {
    let mut paths = vec![
        METADATA_PATH.to_string(),
        format!("{METADATA_PATH}{}", super::http::MCP_PATH),
    ];
    let own = format!("{METADATA_PATH}{}", oauth.resource_path);
    if !paths.contains(&own) {
        paths.push(own);
    }
    let mut router = axum::Router::new();
    for path in paths {
        router = router.route(&path, axum::routing::get(serve_metadata));
    }
    router.with_state(oauth)
}

async fn serve_metadata(
    axum::extract::State(oauth): axum::extract::State<Arc<OAuth>>,
) -> axum::response::Response {
    use axum::http::{header, HeaderValue};
    let mut response =
        axum::response::Response::new(axum::body::Body::from(oauth.metadata().to_string()));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    response
}

fn invalid(description: String) -> OAuthRefusal {
    OAuthRefusal::InvalidToken(description)
}

/// Text fit for a quoted `error_description`: RFC 6750 allows printable ASCII without `"` and
/// `\`.
fn quotable(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '"' | '\\' => '\'',
            ' '..='~' => c,
            _ => '?',
        })
        .collect()
}

/// The metadata URL of a resource (RFC 9728, section 3.1: the well-known path goes between the
/// host and the resource's path), and that path (empty when it has none).
fn metadata_url(resource: &str) -> Result<(String, String), String> {
    let Some((scheme, rest)) = resource.split_once("://") else {
        return Err(format!(
            "SANDBOX_HTTP_RESOURCE_URL={resource:?} is no URL such as https://sandbox.example.com/mcp"
        ));
    };
    let (authority, path) = match rest.find('/') {
        Some(slash) => (&rest[..slash], rest[slash..].trim_end_matches('/')),
        None => (rest, ""),
    };
    Ok((
        format!("{scheme}://{authority}{METADATA_PATH}{path}"),
        path.to_string(),
    ))
}

/// The claims of an access token this server reads (`exp`, `nbf`, `iss` and `aud` are checked
/// by `jsonwebtoken`).
#[derive(Debug, Deserialize)]
struct Claims {
    /// Required (the validation refuses a token without it), read as optional so that its
    /// absence is named as such.
    #[serde(default)]
    sub: Option<String>,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    scp: Option<ScopeList>,
    #[serde(default)]
    sandbox_quotas: Option<QuotaClaim>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ScopeList {
    Many(Vec<String>),
    One(String),
}

impl Claims {
    fn scopes(&self) -> HashSet<&str> {
        let mut scopes: HashSet<&str> = self
            .scope
            .as_deref()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        match &self.scp {
            Some(ScopeList::Many(list)) => scopes.extend(list.iter().map(String::as_str)),
            Some(ScopeList::One(text)) => scopes.extend(text.split_whitespace()),
            None => {}
        }
        scopes
    }
}

/// `sandbox_quotas`: the principal's limits, each optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaClaim {
    sessions: Option<u64>,
    executions: Option<u64>,
    cpu_seconds_per_day: Option<u64>,
}

/// The verification keys of a JWKS.
#[derive(Debug, Default)]
struct KeySet {
    keys: Vec<Key>,
}

struct Key {
    kid: Option<String>,
    /// The algorithms this key may verify: the one its `alg` names, or its type's.
    algorithms: Vec<Algorithm>,
    decoding: DecodingKey,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("kid", &self.kid)
            .field("algorithms", &self.algorithms)
            .finish()
    }
}

impl KeySet {
    /// The usable keys of a JWKS document. Keys for encryption, symmetric keys and kinds this
    /// server does not verify with are skipped (and logged); a document with none left is an
    /// error.
    fn parse(text: &str) -> Result<KeySet, String> {
        #[derive(Deserialize)]
        struct Document {
            keys: Vec<serde_json::Value>,
        }
        let document: Document = serde_json::from_str(text)
            .map_err(|e| format!("not a JWKS (a JSON object with a `keys` array): {e}"))?;
        let mut keys = Vec::new();
        for (index, value) in document.keys.into_iter().enumerate() {
            match Key::from_jwk_value(value) {
                Ok(key) => keys.push(key),
                Err(reason) => tracing::warn!("OAuth: JWKS key {index} is skipped: {reason}"),
            }
        }
        if keys.is_empty() {
            return Err(
                "the JWKS holds no signing key this server verifies with (RSA, EC P-256 or P-384, Ed25519)"
                    .to_string(),
            );
        }
        Ok(KeySet { keys })
    }

    fn has(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
    }

    /// The keys that may have signed a token naming `kid`: that key; without a kid, the only
    /// key.
    fn candidates(&self, kid: Option<&str>) -> Vec<&Key> {
        match kid {
            Some(kid) => self
                .keys
                .iter()
                .filter(|k| k.kid.as_deref() == Some(kid))
                .collect(),
            None if self.keys.len() == 1 => self.keys.iter().collect(),
            None => Vec::new(),
        }
    }
}

impl Key {
    fn from_jwk_value(value: serde_json::Value) -> Result<Key, String> {
        let kid = value
            .get("kid")
            .and_then(|k| k.as_str())
            .map(str::to_string);
        let kty = value
            .get("kty")
            .and_then(|k| k.as_str())
            .unwrap_or("?")
            .to_string();
        let named = |reason: String| match &kid {
            Some(kid) => format!("`{kid}` ({kty}): {reason}"),
            None => format!("({kty}): {reason}"),
        };
        let jwk: Jwk = serde_json::from_value(value).map_err(|e| named(e.to_string()))?;
        if matches!(jwk.common.public_key_use, Some(ref u) if *u != PublicKeyUse::Signature) {
            return Err(named("not a signing key (use)".into()));
        }
        let by_type: Vec<Algorithm> = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => vec![
                Algorithm::RS256,
                Algorithm::RS384,
                Algorithm::RS512,
                Algorithm::PS256,
                Algorithm::PS384,
                Algorithm::PS512,
            ],
            AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
                EllipticCurve::P256 => vec![Algorithm::ES256],
                EllipticCurve::P384 => vec![Algorithm::ES384],
                _ => return Err(named("an EC curve this server does not verify with".into())),
            },
            AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
                vec![Algorithm::EdDSA]
            }
            AlgorithmParameters::OctetKeyPair(_) => {
                return Err(named("an OKP curve other than Ed25519".into()))
            }
            AlgorithmParameters::OctetKey(_) => {
                return Err(named("a symmetric (HMAC) key; never accepted".into()))
            }
        };
        let algorithms = match jwk.common.key_algorithm {
            None => by_type,
            Some(named_alg) => {
                let alg = key_algorithm(named_alg)
                    .filter(|alg| by_type.contains(alg))
                    .ok_or_else(|| named(format!("its alg {named_alg} does not fit its type")))?;
                vec![alg]
            }
        };
        let decoding = DecodingKey::from_jwk(&jwk).map_err(|e| named(e.to_string()))?;
        Ok(Key {
            kid,
            algorithms,
            decoding,
        })
    }
}

/// The signature algorithm a JWK's `alg` names (none for encryption algorithms).
fn key_algorithm(alg: KeyAlgorithm) -> Option<Algorithm> {
    Some(match alg {
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        _ => return None,
    })
}

/// Reads or fetches the JWKS.
async fn load(http: &reqwest::Client, source: &JwksSource) -> Result<KeySet, String> {
    match source {
        JwksSource::File(path) => {
            let text = read_file(path).await?;
            KeySet::parse(&text).map_err(|e| format!("SANDBOX_OAUTH_JWKS {}: {e}", path.display()))
        }
        JwksSource::Url(url) => {
            let text = fetch(http, url).await?;
            KeySet::parse(&text).map_err(|e| format!("SANDBOX_OAUTH_JWKS {url}: {e}"))
        }
    }
}

async fn read_file(path: &Path) -> Result<String, String> {
    let cannot =
        |e: std::io::Error| format!("SANDBOX_OAUTH_JWKS: cannot read {}: {e}", path.display());
    let size = tokio::fs::metadata(path).await.map_err(cannot)?.len();
    if size > MAX_JWKS_BYTES {
        return Err(format!(
            "SANDBOX_OAUTH_JWKS: {} is larger than a JWKS ({size} bytes; at most {MAX_JWKS_BYTES})",
            path.display()
        ));
    }
    tokio::fs::read_to_string(path).await.map_err(cannot)
}

async fn fetch(http: &reqwest::Client, url: &str) -> Result<String, String> {
    let failed = |e: String| format!("SANDBOX_OAUTH_JWKS: cannot fetch {url}: {e}");
    let mut response = http
        .get(url)
        .header(
            reqwest::header::ACCEPT,
            "application/json, application/jwk-set+json",
        )
        .send()
        .await
        .map_err(|e| failed(error_chain(&e)))?;
    let status = response.status();
    if !status.is_success() {
        return Err(failed(format!("the server answered {status}")));
    }
    if response
        .content_length()
        .is_some_and(|n| n > MAX_JWKS_BYTES)
    {
        return Err(failed(format!("larger than {MAX_JWKS_BYTES} bytes")));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| failed(error_chain(&e)))?
    {
        if body.len() as u64 + chunk.len() as u64 > MAX_JWKS_BYTES {
            return Err(failed(format!("larger than {MAX_JWKS_BYTES} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    String::from_utf8(body).map_err(|_| failed("the body is not UTF-8 text".into()))
}

/// An error with its causes (reqwest's own message rarely says what failed).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use ed25519_dalek::pkcs8::EncodePrivateKey;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::{json, Value};

    const ISSUER: &str = "https://issuer.test";
    const RESOURCE: &str = "https://sandbox.example.com/mcp";

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    /// An Ed25519 key made from a seed: its signing key and its JWK.
    fn ed_key(seed: u8, kid: &str) -> (EncodingKey, Value) {
        let signing = ed25519_dalek::SigningKey::from_bytes(&[seed; 32]);
        let der = signing.to_pkcs8_der().expect("pkcs8");
        let jwk = json!({
            "kty": "OKP", "crv": "Ed25519", "use": "sig", "kid": kid,
            "x": b64(signing.verifying_key().as_bytes()),
        });
        (EncodingKey::from_ed_der(der.as_bytes()), jwk)
    }

    /// A P-256 key made from a seed: its signing key and its JWK.
    fn ec_key(seed: u8, kid: &str) -> (EncodingKey, Value) {
        use p256::elliptic_curve::sec1::ToEncodedPoint;
        use p256::pkcs8::EncodePrivateKey;
        let secret = p256::SecretKey::from_slice(&[seed; 32]).expect("a scalar");
        let der = secret.to_pkcs8_der().expect("pkcs8");
        let point = secret.public_key().to_encoded_point(false);
        let jwk = json!({
            "kty": "EC", "crv": "P-256", "alg": "ES256", "kid": kid,
            "x": b64(point.x().expect("x")), "y": b64(point.y().expect("y")),
        });
        (EncodingKey::from_ec_der(der.as_bytes()), jwk)
    }

    fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    fn claims() -> Value {
        json!({
            "iss": ISSUER, "aud": RESOURCE, "sub": "alice",
            "exp": now() + 300, "nbf": now() - 10, "scope": "openid sandbox:run",
        })
    }

    fn with(mut claims: Value, changes: Value) -> Value {
        for (k, v) in changes.as_object().expect("an object") {
            if v.is_null() {
                claims.as_object_mut().expect("an object").remove(k);
            } else {
                claims[k] = v.clone();
            }
        }
        claims
    }

    fn sign(alg: Algorithm, kid: Option<&str>, key: &EncodingKey, claims: &Value) -> String {
        let mut header = Header::new(alg);
        header.kid = kid.map(str::to_string);
        jsonwebtoken::encode(&header, claims, key).expect("signed")
    }

    async fn server(keys: &[&Value]) -> (OAuth, tempfile_path::TempPath) {
        let path = tempfile_path::TempPath::new("jwks");
        std::fs::write(&path.0, json!({ "keys": keys }).to_string()).expect("written");
        let mut config = Config::default();
        config.http.oauth.issuer = Some(ISSUER.into());
        config.http.oauth.resource_url = Some(RESOURCE.into());
        config.http.oauth.jwks = Some(JwksSource::File(path.0.clone()));
        let oauth = OAuth::from_config(&config)
            .await
            .expect("loaded")
            .expect("on");
        (oauth, path)
    }

    /// A file removed when dropped.
    mod tempfile_path {
        pub struct TempPath(pub std::path::PathBuf);
        impl TempPath {
            pub fn new(name: &str) -> TempPath {
                TempPath(std::env::temp_dir().join(format!(
                    "pcs-oauth-{}-{}-{name}.json",
                    std::process::id(),
                    uuid::Uuid::new_v4().simple()
                )))
            }
        }
        impl Drop for TempPath {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    fn refused(result: Result<Principal, OAuthRefusal>) -> OAuthRefusal {
        result.expect_err("refused")
    }

    #[tokio::test]
    async fn a_valid_token_names_its_principal_with_scopes_and_quotas() {
        let (ed, ed_jwk) = ed_key(7, "ed");
        let (ec, ec_jwk) = ec_key(9, "ec");
        let (oauth, _file) = server(&[&ed_jwk, &ec_jwk]).await;

        let alice = oauth
            .identify(&sign(Algorithm::EdDSA, Some("ed"), &ed, &claims()))
            .await
            .expect("valid");
        assert_eq!(alice, Principal::new("oauth:alice"));

        let admin = with(
            claims(),
            json!({"sub": "root", "scope": null, "scp": ["sandbox:run", "sandbox:admin"],
                   "aud": ["other", RESOURCE],
                   "sandbox_quotas": {"sessions": 3, "cpu_seconds_per_day": 600}}),
        );
        let root = oauth
            .identify(&sign(Algorithm::ES256, Some("ec"), &ec, &admin))
            .await
            .expect("valid");
        assert_eq!(root.name, "oauth:root");
        assert!(root.admin);
        assert_eq!(root.quotas.sessions, Some(3));
        assert_eq!(root.quotas.executions, None);
        assert_eq!(root.quotas.cpu_seconds_per_day, Some(600));
    }

    #[tokio::test]
    async fn claims_are_checked() {
        let (ed, jwk) = ed_key(7, "ed");
        let (oauth, _file) = server(&[&jwk]).await;
        let token =
            |changes: Value| sign(Algorithm::EdDSA, Some("ed"), &ed, &with(claims(), changes));
        for (changes, expected) in [
            (
                json!({"aud": "https://other.example.com/mcp"}),
                "aud must include",
            ),
            (json!({"aud": null}), "no aud claim"),
            (json!({"iss": "https://evil.test"}), "another issuer"),
            (json!({"iss": null}), "no iss claim"),
            (json!({"exp": now() - 120}), "expired"),
            (json!({"exp": null}), "no exp claim"),
            (json!({"nbf": now() + 120}), "not valid yet"),
            (json!({"sub": null}), "no sub claim"),
            (json!({"sub": ""}), "sub claim is empty"),
            (
                json!({"sandbox_quotas": {"sesions": 2}}),
                "claims are malformed",
            ),
            (
                json!({"sandbox_quotas": {"sessions": "two"}}),
                "claims are malformed",
            ),
        ] {
            let refusal = refused(oauth.identify(&token(changes.clone())).await);
            assert_eq!(refusal.status(), StatusCode::UNAUTHORIZED, "{changes}");
            assert!(
                refusal.description().contains(expected),
                "{changes}: {refusal}"
            );
        }
        // Within the leeway, a just-expired or not-quite-valid token passes.
        assert!(oauth
            .identify(&token(json!({"exp": now() - 5})))
            .await
            .is_ok());
        assert!(oauth
            .identify(&token(json!({"nbf": now() + 5})))
            .await
            .is_ok());
    }

    #[tokio::test]
    async fn the_run_scope_is_needed() {
        let (ed, jwk) = ed_key(7, "ed");
        let (oauth, _file) = server(&[&jwk]).await;
        for scopes in [
            json!({"scope": "openid"}),
            json!({"scope": null}),
            json!({"scope": "sandbox:admin"}),
        ] {
            let token = sign(
                Algorithm::EdDSA,
                Some("ed"),
                &ed,
                &with(claims(), scopes.clone()),
            );
            let refusal = refused(oauth.identify(&token).await);
            assert_eq!(refusal.status(), StatusCode::FORBIDDEN, "{scopes}");
            assert_eq!(refusal.error(), "insufficient_scope");
            let challenge = oauth.challenge(Some(&refusal));
            assert!(
                challenge.starts_with("Bearer error=\"insufficient_scope\""),
                "{challenge}"
            );
            assert!(challenge.contains("scope=\"sandbox:run\""), "{challenge}");
        }
        let spaced = with(claims(), json!({"scope": null, "scp": "a sandbox:run"}));
        let token = sign(Algorithm::EdDSA, Some("ed"), &ed, &spaced);
        assert!(oauth.identify(&token).await.is_ok());
    }

    #[tokio::test]
    async fn signatures_keys_and_algorithms_are_checked() {
        let (ed, jwk) = ed_key(7, "ed");
        let (other, _) = ed_key(8, "ed");
        let (oauth, _file) = server(&[&jwk]).await;

        let forged = sign(Algorithm::EdDSA, Some("ed"), &other, &claims());
        assert!(refused(oauth.identify(&forged).await)
            .description()
            .contains("signature"));

        let unknown = sign(Algorithm::EdDSA, Some("rotated"), &ed, &claims());
        let refusal = refused(oauth.identify(&unknown).await);
        assert!(refusal.description().contains("kid `rotated`"), "{refusal}");

        // The only key serves a token without a kid.
        assert!(oauth
            .identify(&sign(Algorithm::EdDSA, None, &ed, &claims()))
            .await
            .is_ok());

        // An EC key cannot verify an Ed25519 token claiming its kid, nor the reverse.
        let (ec, ec_jwk) = ec_key(9, "ec");
        let (both, _file2) = server(&[&jwk, &ec_jwk]).await;
        let confused = sign(Algorithm::ES256, Some("ed"), &ec, &claims());
        assert!(refused(both.identify(&confused).await)
            .description()
            .contains("not for ES256"));
        let no_kid = sign(Algorithm::ES256, None, &ec, &claims());
        assert!(refused(both.identify(&no_kid).await)
            .description()
            .contains("no key (kid)"));

        // alg none: an unsigned token.
        let header = b64(br#"{"alg":"none","typ":"JWT","kid":"ed"}"#);
        let body = b64(claims().to_string().as_bytes());
        for unsigned in [format!("{header}.{body}."), format!("{header}.{body}")] {
            let refusal = refused(oauth.identify(&unsigned).await);
            assert_eq!(refusal.error(), "invalid_token", "{refusal}");
        }
        // HMAC, even with a secret the attacker put in a JWKS of its own.
        let hmac = sign(
            Algorithm::HS256,
            Some("ed"),
            &EncodingKey::from_secret(b"secret"),
            &claims(),
        );
        assert!(refused(oauth.identify(&hmac).await)
            .description()
            .contains("HS256"));
        assert!(refused(oauth.identify("garbage").await)
            .description()
            .contains("not a signed JWT"));
    }

    #[tokio::test]
    async fn a_jwks_keeps_only_signing_keys_it_can_use() {
        let (_, ed) = ed_key(7, "ed");
        let oct = json!({"kty": "oct", "k": b64(b"secret"), "kid": "hmac"});
        let enc = with(ed.clone(), json!({"use": "enc", "kid": "enc"}));
        let wrong_alg = with(ed.clone(), json!({"alg": "RS256", "kid": "wrong"}));
        let x25519 = json!({"kty": "OKP", "crv": "X25519", "x": b64(&[1; 32]), "kid": "x"});
        let keys = json!({"keys": [oct, enc, wrong_alg, x25519, ed]}).to_string();
        let set = KeySet::parse(&keys).expect("one usable key");
        assert_eq!(set.keys.len(), 1);
        assert_eq!(set.keys[0].kid.as_deref(), Some("ed"));
        let none = json!({"keys": [json!({"kty": "oct", "k": "c2VjcmV0"})]}).to_string();
        assert!(KeySet::parse(&none).unwrap_err().contains("no signing key"));
        assert!(KeySet::parse("[]").unwrap_err().contains("not a JWKS"));
    }

    #[tokio::test]
    async fn challenges_and_metadata_point_at_each_other() {
        let (_, jwk) = ed_key(7, "ed");
        let (oauth, _file) = server(&[&jwk]).await;
        let url = "https://sandbox.example.com/.well-known/oauth-protected-resource/mcp";
        assert_eq!(oauth.metadata_url(), url);
        assert_eq!(
            oauth.challenge(None),
            format!("Bearer resource_metadata=\"{url}\", scope=\"sandbox:run\"")
        );
        let bad = OAuthRefusal::InvalidToken("a \"quoted\" reason \\ é".into());
        assert_eq!(
            oauth.challenge(Some(&bad)),
            format!(
                "Bearer error=\"invalid_token\", error_description=\"a 'quoted' reason ' ?\", resource_metadata=\"{url}\", scope=\"sandbox:run\""
            )
        );
        let metadata = oauth.metadata();
        assert_eq!(metadata["resource"], RESOURCE);
        assert_eq!(metadata["authorization_servers"], json!([ISSUER]));
        assert_eq!(
            metadata["scopes_supported"],
            json!(["sandbox:run", "sandbox:admin"])
        );
        assert_eq!(metadata["bearer_methods_supported"], json!(["header"]));
        assert!(oauth.is_metadata_path(METADATA_PATH));
        assert!(oauth.is_metadata_path("/.well-known/oauth-protected-resource/mcp"));
        assert!(!oauth.is_metadata_path("/.well-known/oauth-protected-resource/other"));
        assert!(!oauth.is_metadata_path("/mcp"));
        assert_eq!(
            metadata_url("https://h.example:8443").unwrap().0,
            "https://h.example:8443/.well-known/oauth-protected-resource"
        );
        assert_eq!(
            metadata_url("https://h.example/a/mcp/").unwrap(),
            (
                "https://h.example/.well-known/oauth-protected-resource/a/mcp".to_string(),
                "/a/mcp".to_string()
            )
        );
    }

    #[tokio::test]
    async fn a_rotated_key_is_loaded_again_at_most_once_a_minute() {
        let (old, old_jwk) = ed_key(7, "old");
        let (new, new_jwk) = ed_key(8, "new");
        let (newer, newer_jwk) = ed_key(9, "newer");
        let (oauth, file) = server(&[&old_jwk]).await;
        std::fs::write(&file.0, json!({ "keys": [old_jwk, new_jwk] }).to_string())
            .expect("written");
        // Loaded at start: a token naming an unknown key waits for the interval to pass.
        let rotated = sign(Algorithm::EdDSA, Some("new"), &new, &claims());
        assert!(oauth.identify(&rotated).await.is_err());
        let a_minute_ago = Instant::now().checked_sub(REFETCH_INTERVAL + Duration::from_secs(1));
        *oauth.loaded.lock().await = a_minute_ago.expect("the clock is past a minute");
        assert_eq!(
            oauth.identify(&rotated).await.expect("loaded").name,
            "oauth:alice"
        );
        assert!(oauth
            .identify(&sign(Algorithm::EdDSA, Some("old"), &old, &claims()))
            .await
            .is_ok());
        // The next unknown key within the minute does not load the JWKS again.
        std::fs::write(&file.0, json!({ "keys": [newer_jwk] }).to_string()).expect("written");
        let newest = sign(Algorithm::EdDSA, Some("newer"), &newer, &claims());
        assert!(oauth.identify(&newest).await.is_err());
        // A load that fails keeps the keys in force.
        std::fs::write(&file.0, "not json").expect("written");
        *oauth.loaded.lock().await = a_minute_ago.expect("the clock is past a minute");
        assert!(oauth.identify(&newest).await.is_err());
        assert!(oauth.identify(&rotated).await.is_ok());
    }

    #[test]
    fn oauth_like_a_token_allows_binding_beyond_loopback() {
        let any = "0.0.0.0:8080".parse().expect("an address");
        let mut config = Config::default();
        assert!(super::super::http::refuse_bind(any, &config).is_some());
        config.http.oauth.issuer = Some(ISSUER.into());
        config.http.oauth.resource_url = Some(RESOURCE.into());
        config.http.oauth.jwks = Some(JwksSource::Url("https://issuer.test/jwks".into()));
        assert!(super::super::http::refuse_bind(any, &config).is_none());
    }

    #[tokio::test]
    async fn an_unreadable_jwks_stops_the_start_with_its_reason() {
        let mut config = Config::default();
        config.http.oauth.issuer = Some(ISSUER.into());
        config.http.oauth.resource_url = Some(RESOURCE.into());
        config.http.oauth.jwks = Some(JwksSource::File("/nonexistent/pcs-jwks.json".into()));
        let error = OAuth::from_config(&config).await.unwrap_err();
        assert!(
            error.contains("cannot read /nonexistent/pcs-jwks.json"),
            "{error}"
        );
        assert!(OAuth::from_config(&Config::default())
            .await
            .unwrap()
            .is_none());
    }
}
