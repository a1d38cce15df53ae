//! The roles and the database the application uses, created and kept on the
//! passwords in the Secret by the primary.

use cairn_api::database::instance as contract;
use tokio_postgres::Client;

use super::Supervisor;
use crate::error::{Context, Error};
use crate::scram;

impl Supervisor {
    /// The application database, its owner and the replication user, created
    /// when missing; a role's password (the superuser's too) set again when
    /// the Secret's differs (a rotation, a restored backup). Passwords travel as SCRAM verifiers, never in clear.
    pub(super) async fn ensure_roles(&self, client: &Client) -> bool {
        match self.try_ensure_roles(client).await {
            Ok(()) => true,
            Err(error) => {
                self.state
                    .failed_saying(&error, format!("the application's roles: {error}"));
                false
            }
        }
    }

    pub(super) async fn try_ensure_roles(&self, client: &Client) -> Result<(), Error> {
        let owner = self.credential(contract::OWNER_KEY)?;
        let database = self.credential(contract::DATABASE_KEY)?;
        let users = [
            // Its password set from the Secret when it differs (a restored
            // backup's, or a rotation); it always exists.
            (
                "postgres".to_owned(),
                contract::SUPERUSER_PASSWORD_KEY,
                "SUPERUSER LOGIN",
            ),
            (owner.clone(), contract::OWNER_PASSWORD_KEY, "LOGIN"),
            (
                self.credential(contract::REPLICATION_USER_KEY)?,
                contract::REPLICATION_PASSWORD_KEY,
                "LOGIN REPLICATION",
            ),
        ];
        let sql = || "creating the roles and the database".to_owned();
        // With synchronous replication, these commits would wait for replicas
        // that cannot clone this primary before it is ready (the roles are
        // part of ready): they need no replica's confirmation. A primary
        // promoted after losing them creates them again from the Secret.
        client
            .batch_execute("SET synchronous_commit = local")
            .await
            .context(sql)?;
        for (user, password_key, attributes) in users {
            let password = self.credential(password_key)?;
            let stored: Option<Option<String>> = client
                .query_opt(
                    "SELECT rolpassword FROM pg_authid WHERE rolname = $1",
                    &[&user],
                )
                .await
                .context(sql)?
                .map(|row| row.get(0));
            let create = match stored {
                None => true,
                Some(Some(verifier)) if scram::verifies(&password, &verifier) => continue,
                Some(_) => false,
            };
            let name = identifier(&user);
            let verifier = literal(&postgres_protocol::password::scram_sha_256(
                password.as_bytes(),
            ));
            let statement = match create {
                true => format!("CREATE ROLE {name} {attributes} PASSWORD {verifier}"),
                false => format!("ALTER ROLE {name} PASSWORD {verifier}"),
            };
            // The verifier is no secret, but it is what a brute force needs:
            // keep the statement out of the server's log, even if it fails.
            // (A query string is logged whole before it runs: the settings
            // go first, in a query of their own.)
            client
                .batch_execute(
                    "BEGIN; SET LOCAL log_statement = 'none'; \
                     SET LOCAL log_min_error_statement = 'panic'",
                )
                .await
                .context(sql)?;
            let done = client.batch_execute(&statement).await;
            let end = if done.is_ok() { "COMMIT" } else { "ROLLBACK" };
            let ended = client.batch_execute(end).await;
            done.and(ended).context(sql)?;
            match create {
                true => tracing::info!(role = %user, "created role"),
                false => tracing::info!(role = %user, "set the role's password from the Secret"),
            }
        }
        let exists = client
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&database])
            .await
            .context(sql)?;
        if exists.is_none() {
            client
                .batch_execute(&format!(
                    "CREATE DATABASE {} OWNER {}",
                    identifier(&database),
                    identifier(&owner)
                ))
                .await
                .context(sql)?;
            tracing::info!(%database, %owner, "created the application database");
        }
        Ok(())
    }
}

pub(super) fn identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

pub(super) fn literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(identifier("a\"b"), "\"a\"\"b\"");
        assert_eq!(literal("it's"), "'it''s'");
    }
}
