"""The gateway's wire protocol, shared by both ends: the gateway (server/) and the tcp://
client (client/) each import it, and neither imports the other."""

from amps_on_kafka.protocol.frames import READ_SIZE, BadFrame, Frame, FrameDecoder, encode_frame

__all__ = ["READ_SIZE", "BadFrame", "Frame", "FrameDecoder", "encode_frame"]
