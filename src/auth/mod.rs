//! Who is calling: parsing the `Authorization` header into a [`Credential`],
//! and the [`Principal`] a checked credential stands for, with its scopes.
pub mod credential;
pub mod jwt;
pub mod oidc;
mod principal;

pub use credential::{parse_authorization, Credential, CredentialError};
pub use principal::{Principal, Scopes};
