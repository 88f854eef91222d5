"""The gateway's security (docs/security.md): TLS contexts, authentication at logon and
entitlements. The server imports this package; it imports nothing of the server."""
