/* What releasing a held rendezvous port costs (attempt/rendezvous.rs), in two forms:
 *   close            the held socket closed (a TCP socket's teardown), and a new socket made,
 *                    bound and asked its port for the next one (socket, bind, getsockname);
 *   listen+shutdown  the held socket listens and is shut down, which unbinds it, and is bound
 *                    again for the next port (bind, getsockname).
 * First checks that a port released by listen+shutdown is free to a plain bind (no
 * SO_REUSEADDR) and that the socket binds again. 16 ports held at a time, as a run holds one per
 * stage opened ahead; microseconds per release and per take, 20,000 of each, 3 rounds.
 *
 *   cc -O2 -o /tmp/port_release bench/overhead/port_release.c && /tmp/port_release
 */
#include <stdio.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>
#include <time.h>
#include <string.h>
#include <errno.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static int bind0(int fd){struct sockaddr_in a;memset(&a,0,sizeof a);a.sin_family=AF_INET; if(bind(fd,(void*)&a,sizeof a)) return -1; socklen_t l=sizeof a; getsockname(fd,(void*)&a,&l); return ntohs(a.sin_port);}
int main(){
 // correctness: release via listen+shutdown, then someone else binds it
 int s=socket(AF_INET,SOCK_STREAM|SOCK_CLOEXEC,0); int p=bind0(s);
 int o=socket(AF_INET,SOCK_STREAM,0); struct sockaddr_in a;memset(&a,0,sizeof a);a.sin_family=AF_INET;a.sin_port=htons(p);
 int held=bind(o,(void*)&a,sizeof a);
 printf("held: another socket binds it -> %d (errno %d)\n", held, held ? errno : 0);
 listen(s,0); int r=shutdown(s,SHUT_RDWR); printf("shutdown -> %d\n", r);
 printf("released: other bind -> %d\n", bind(o,(void*)&a,sizeof a));
 printf("other listen -> %d\n", listen(o,5));
 int p2=bind0(s); printf("rebind pooled socket -> port %d (was %d)\n", p2, p);
 close(o); close(s);
 int N=20000, K=16; int pool[16];
 for(int rep=0;rep<3;rep++){
  double tc=0,tr=0,tl=0,tb=0; 
  // current: socket+bind+getsockname (take) ; close (release), K held at once as a ring
  for(int i=0;i<K;i++){pool[i]=socket(AF_INET,SOCK_STREAM|SOCK_CLOEXEC,0); bind0(pool[i]);}
  for(int i=0;i<N;i++){int k=i%K; double t=now(); close(pool[k]); tr+=now()-t; t=now(); pool[k]=socket(AF_INET,SOCK_STREAM|SOCK_CLOEXEC,0); bind0(pool[k]); tc+=now()-t;}
  for(int i=0;i<K;i++) close(pool[i]);
  for(int i=0;i<K;i++){pool[i]=socket(AF_INET,SOCK_STREAM|SOCK_CLOEXEC,0); bind0(pool[i]);}
  for(int i=0;i<N;i++){int k=i%K; double t=now(); listen(pool[k],0); shutdown(pool[k],SHUT_RDWR); tl+=now()-t; t=now(); bind0(pool[k]); tb+=now()-t;}
  for(int i=0;i<K;i++) close(pool[i]);
  printf("close %.2f  socket+bind+getsockname %.2f  | listen+shutdown %.2f  bind+getsockname %.2f (us)\n", tr/N, tc/N, tl/N, tb/N);
 }
}
