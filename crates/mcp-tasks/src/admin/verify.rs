//! `store verify`: every record decoded, the indexes checked and, on a redb file no server holds, the page checksums.

use super::{
    AdminError, Inspector, Location, SCAN_BATCH, VerifyReport, decode, held, open_reader, socket,
};

/// `store verify`: decodes every record and checks the indexes; on a redb file no server
/// holds, also redb's page checksums.
pub async fn verify(location: &Location) -> Result<VerifyReport, AdminError> {
    match location.store_kind().check_pages(location.as_str()).await {
        Err(AdminError::InUse { .. }) => {
            return socket::ask(location, socket::Request::Verify).await;
        }
        Err(e) => return Err(e),
        Ok(Some(crate::store::inspect::PageCheck { reader, problem })) => {
            let mut report = verify_of(&*reader).await?;
            report.pages_checked = true;
            report.pages_problem = problem;
            return Ok(report);
        }
        Ok(None) => {}
    }
    match open_reader(location).await? {
        Some(reader) => verify_of(&*reader).await,
        None => Err(held(location)),
    }
}

/// Decodes every record (the index checks are the backend's).
pub(crate) async fn verify_of(reader: &dyn Inspector) -> Result<VerifyReport, AdminError> {
    let mut report = VerifyReport::default();
    let mut after = None;
    loop {
        let rows = reader.scan(after.clone(), SCAN_BATCH).await?;
        let Some(last) = rows.last() else { break };
        after = Some(last.id.clone());
        for row in &rows {
            report.records += 1;
            match decode(row) {
                Ok(record) if record.id.as_str() != row.id => {
                    report.undecodable.insert(
                        row.id.clone(),
                        format!("the record names another id ({})", record.id),
                    );
                }
                Ok(_) => {}
                Err(e) => {
                    report.undecodable.insert(row.id.clone(), e);
                }
            }
        }
    }
    report.index_problems = reader.index_problems().await?;
    Ok(report)
}
