//! Credentials: the secret formats (API keys, session tokens, their hashes)
//! and parsing the `Authorization` header into a [`Credential`].
pub mod credential;
pub mod token;

pub use credential::{parse_authorization, Credential, CredentialError};
pub use token::{
    check_api_key_format, check_session_token_format, generate_api_key, generate_id,
    generate_key_id, generate_session_token, hash_secret, FormatError, SecretHash, API_KEY_PREFIX,
    SESSION_PREFIX,
};
