package billinglog

// FirstSQL is the lookup's statement, for tests of its plan.
var FirstSQL = firstSQL
