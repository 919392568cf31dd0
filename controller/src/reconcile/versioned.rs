//! Writes whose response is read for the resourceVersion alone.
//!
//! The API server answers a write with the whole object as written, which it encodes and the
//! controller decodes, `managedFields` included. Every allocation makes three writes (the config
//! applied, its status, the pool's status) and reads nothing from their responses but, for the
//! pool, the version to continue from: asked for as `PartialObjectMetadata`, the response is the
//! object's metadata. (`foundation` checks against the real API server that a write answered
//! this way holds exactly what was sent.)

use kube::Client;
use serde::Deserialize;

/// The `Accept` of a write whose response is its object's metadata alone.
pub const METADATA_ONLY: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

/// What a write's response is read for.
#[derive(Deserialize)]
struct Written {
    metadata: WrittenMeta,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenMeta {
    resource_version: Option<String>,
}

/// Sends `request` (a write as `kube::core::Request` builds it) asking for its object's metadata
/// alone, and returns the resourceVersion the write made (`None`: the response did not say,
/// which the API server never does). `verb` names the call in kube's request spans, as its
/// `Api` methods do.
pub async fn send(
    client: &Client,
    request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    verb: &'static str,
) -> Result<Option<String>, kube::Error> {
    let mut request = request.map_err(kube::Error::BuildRequest)?;
    request.headers_mut().insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static(METADATA_ONLY),
    );
    request.extensions_mut().insert(verb);
    let written: Written = client.request(request).await?;
    Ok(written.metadata.resource_version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_read_from_metadata_alone_and_full_objects_too() {
        let partial = r#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"a","resourceVersion":"42","managedFields":[{"manager":"x"}]}}"#;
        let full = r#"{"kind":"IPPool","metadata":{"resourceVersion":"43"},"spec":{"x":1},"status":{"ipv4":{}}}"#;
        let version = |s: &str| {
            serde_json::from_str::<Written>(s)
                .unwrap()
                .metadata
                .resource_version
        };
        assert_eq!(version(partial).as_deref(), Some("42"));
        assert_eq!(version(full).as_deref(), Some("43"));
        assert_eq!(version(r#"{"metadata":{}}"#), None);
    }
}
