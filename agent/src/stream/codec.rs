//! The Watch call's gRPC codec: requests go out as protobuf, responses come in as the raw bytes
//! of each frame, decoded by the client itself.
//!
//! With tonic's protobuf codec a frame that does not decode surfaces as a transport `Status`,
//! indistinguishable from a broken connection; handing the bytes over lets the client make it a
//! [`super::StreamError::Malformed`] message, which is rejected and answered with a request for a
//! fresh snapshot instead of a reconnect that would resume into the same frame.

use prost::Message as _;
use prost::bytes::{Buf as _, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use vmdhcp_proto::agent::v1 as pb;

/// The Watch call's codec: protobuf requests, undecoded response frames (see the module doc
/// for why the client decodes them itself).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct FrameCodec;

/// Encodes Watch requests (protobuf).
pub(super) struct RequestEncoder;

/// Hands each response frame over undecoded.
pub(super) struct FrameDecoder;

impl Codec for FrameCodec {
    type Encode = pb::WatchRequest;
    type Decode = Bytes;
    type Encoder = RequestEncoder;
    type Decoder = FrameDecoder;

    fn encoder(&mut self) -> RequestEncoder {
        RequestEncoder
    }

    fn decoder(&mut self) -> FrameDecoder {
        FrameDecoder
    }
}

impl Encoder for RequestEncoder {
    type Item = pb::WatchRequest;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: pb::WatchRequest,
        dst: &mut EncodeBuf<'_>,
    ) -> Result<(), Self::Error> {
        item.encode(dst)
            .map_err(|e| tonic::Status::internal(format!("encoding WatchRequest: {e}")))
    }
}

impl Decoder for FrameDecoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Self::Error> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
