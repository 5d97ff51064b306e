package pgrecords

// SQLClaim is the claim statement, for tests that look at what it returns.
const SQLClaim = sqlClaim
