/*-------------------------------------------------------------------------
 *
 * job.h
 *	  Declarations shared by the table job files (job.c, job_worker.c).
 *
 * IDENTIFICATION
 *	  src/pg/job.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef GEMMA4_JOB_H
#define GEMMA4_JOB_H

#include "postgres.h"

#include "storage/lock.h"

/* What a job worker is told besides its job id (bgw_main_arg). */
typedef struct G4JobWorkerArgs
{
	Oid			database;
	Oid			owner;			/* the worker connects as this role */
	int			index;			/* 0 .. workers - 1 */
} G4JobWorkerArgs;

/* The name of one of the extension's tables or functions, schema-qualified
 * and quoted for SQL. */
extern char *g4_job_table(const char *name);
/* The session lock worker `index` of a job holds while it runs, in this
 * database (job_worker.c). */
extern void g4_job_worker_lock_tag(LOCKTAG *tag, int64 job, int index);
/* Start worker `index` of a job (a warning when no worker slot is free). */
extern void g4_register_job_worker(int64 job, Oid database, Oid owner, int index);

extern PGDLLEXPORT void gemma4_job_launcher_main(Datum arg);
extern PGDLLEXPORT void gemma4_job_starter_main(Datum arg);
extern PGDLLEXPORT void gemma4_job_worker_main(Datum arg);

#endif							/* GEMMA4_JOB_H */
