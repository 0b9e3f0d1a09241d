/*
 * mfsdp_mpi.h: the MPI part of libmfsdp's public interface, kept out of
 * mfsdp.h so that trainers without MPI never see <mpi.h>.
 *
 * The MPI backend runs one process per rank. Initialize MPI with
 * MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...): the inner and outer stream
 * threads of a rank call MPI concurrently (each on its own communicators).
 * The communicator handed in must span exactly the mesh's world; the runtime
 * duplicates it (and splits the duplicate into one communicator per axis group
 * per stream), so the trainer's own traffic on it never interleaves.
 */
#ifndef MFSDP_MPI_H
#define MFSDP_MPI_H

#include <mpi.h>

#include "mfsdp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Selects the MPI backend over *comm (borrowed until mfsdp_create returns;
 * rank -1 takes the rank from the communicator). */
static inline void mfsdp_config_set_mpi(mfsdp_config *cfg, MPI_Comm *comm)
{
    cfg->backend = MFSDP_BACKEND_MPI;
    cfg->mpi_comm = (void *)comm;
    cfg->local_group = NULL;
}

#ifdef __cplusplus
}
#endif

#endif
